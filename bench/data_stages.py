"""Time the data stages on a COCO2017-layout dataset of realistic size (BENCHMARKS.md).

usage: python -m bench.data_stages --dataset DIR --out DIR [--cores N]

Zips the dataset as the three archives (stored, like COCO's JPEG zips), serves them from 127.0.0.1, runs the
workflow's download, extract and verify jobs through `snakemake` up to the verify report, then stages the
verified copy to /dev/shm with the train job's own staging function. Reports extraction MB/s, verify seconds
and staging MB/s from the jobs' benchmark files, and writes <out>/data_stages.json.
"""

from __future__ import annotations

import argparse
import csv
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import yaml

from rfdetr_coco_pipeline.common import md5_of_file
from rfdetr_coco_pipeline.data.dataset import count_images
from rfdetr_coco_pipeline.data.stage import manifest_of, stage_dataset

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"annotations_trainval2017": "annotations", "val2017": "val2017", "train2017": "train2017"}


def zip_stored(root: Path, folder: str, archive: Path) -> None:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted((root / folder).rglob("*")):
            zf.write(path, path.relative_to(root).as_posix())


def benchmark_seconds(tsv: Path) -> float:
    with open(tsv) as handle:
        return float(next(csv.DictReader(handle, delimiter="\t"))["s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cores", default="all")
    parser.add_argument("--ramdisk", default="/dev/shm")
    args = parser.parse_args()
    served = args.out / "served"
    served.mkdir(parents=True, exist_ok=True)
    archives: dict[str, Any] = {}
    for name, folder in FOLDERS.items():
        archive = served / f"{name}.zip"
        if not archive.exists():
            zip_stored(args.dataset, folder, archive)
        extracted = manifest_of(args.dataset / folder)[0].bytes
        archives[name] = {
            "md5": md5_of_file(archive).hexdigest(),
            "folder": folder,
            "size_bytes": archive.stat().st_size,
            "extracted_bytes": extracted,
        }

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workdir = args.out / "workflow"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    for name, info in archives.items():
        info["url"] = f"http://127.0.0.1:{server.server_address[1]}/{name}.zip"
    config["archives"] = archives
    config["verify"]["expected_images"] = {s: count_images(args.dataset / s) for s in ("train2017", "val2017")}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(workdir / "config.yaml"), "--cores", args.cores, "results/verify/dataset.json"]
    started = time.perf_counter()
    with open(args.out / "snakemake.log", "w") as log:
        subprocess.run(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.perf_counter() - started
    server.shutdown()

    bench = workdir / "results" / "benchmarks"
    total_archive = sum(a["size_bytes"] for a in archives.values())
    total_extracted = sum(a["extracted_bytes"] for a in archives.values())
    download_s = sum(benchmark_seconds(bench / "download" / f"{n}.tsv") for n in archives)
    extract_s = sum(benchmark_seconds(bench / "extract" / f"{f}.tsv") for f in FOLDERS.values())
    verify_s = benchmark_seconds(bench / "verify" / "dataset.tsv")
    dataset = workdir / config["data_dir"] / "coco2017"
    subdir = f"bench-data-stages-{os.getpid()}"
    staged = stage_dataset(dataset, Path(args.ramdisk), subdir, headroom_bytes=0, workers=16)
    shutil.rmtree(Path(args.ramdisk) / subdir, ignore_errors=True)
    images = sum(config["verify"]["expected_images"].values())
    result = {
        "images": images,
        "mean_image_kb": round(
            manifest_of(args.dataset / "train2017")[0].bytes / config["verify"]["expected_images"]["train2017"] / 1e3, 1
        ),
        "archive_mb": round(total_archive / 1e6, 1),
        "extracted_mb": round(total_extracted / 1e6, 1),
        "cores": os.cpu_count() if args.cores == "all" else int(args.cores),
        "download_seconds_loopback_md5": round(download_s, 1),
        "extract_seconds": round(extract_s, 1),
        "extract_mb_per_s": round(total_extracted / 1e6 / extract_s, 1),
        "verify_seconds": round(verify_s, 1),
        "verify_images_per_s": round(images / verify_s, 1),
        "stage_where": staged["where"],
        "stage_seconds": staged.get("seconds"),
        "stage_mb_per_s": round(total_extracted / 1e6 / staged["seconds"], 1) if staged.get("seconds") else None,
        "snakemake_wall_seconds": round(wall, 1),
    }
    (args.out / "data_stages.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

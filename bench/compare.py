"""The reference notebook's stock recipe against the workflow's train stage, same dataset, one run.

usage: python -m bench.compare --dataset DIR --out DIR [--only stock|pipeline] [--stock-epochs 2]
           [--pipeline-epochs 4 --epochs-per-block 2] [--gpus 1] [--profile auto]

`--dataset` is any COCO2017-layout folder (train2017/, val2017/, annotations/): real COCO, or a synthetic set.
The stock recipe runs in a fresh process with an empty compile cache. The workflow runs through `snakemake`
(staging and all) in blocks, so its first block starts with a cold compile cache and its second with the
cache the first one left. Prints, for each, steady images/s, epoch-0 overhead, first-validation seconds and
peak GPU memory, and writes them to <out>/summary.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from rfdetr_coco_pipeline.blocks import block_name, block_ranges
from rfdetr_coco_pipeline.common import read_json
from rfdetr_coco_pipeline.data.dataset import count_images

REPO = Path(__file__).resolve().parents[1]


# Steps at the start of an epoch left out of the mid-epoch rate: the loader's workers start the epoch's batches all
# at once, so the first steps wait for data however fast the step is.
EPOCH_START_STEPS = 8


def mid_epoch_images_per_second(records: list[dict[str, Any]]) -> float | None:
    """Images/s of the steps after the first EPOCH_START_STEPS of each epoch, on the GPU's clock (EpochLog's
    `step_seconds`): the rate of a long epoch, such as COCO's 924 steps at batch 128, without the boundaries that
    weigh on the short epochs of a benchmark set."""
    images = seconds = 0.0
    for record in records:
        steps = record.get("step_seconds") or []
        per_step = record["images"] / (len(steps) + 1)  # step_seconds spans the steps after the first
        kept = steps[EPOCH_START_STEPS:]
        images += per_step * len(kept)
        seconds += sum(kept)
    return round(images / seconds, 1) if seconds else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Steady images/s (whole epochs after the first of the process; and mid-epoch, see
    mid_epoch_images_per_second) and the first epoch's extra seconds."""
    first, later = records[0], records[1:]
    steady = sum(r["images_per_second"] for r in later) / len(later) if later else None
    return {
        "epochs": [r["epoch"] for r in records],
        "steady_images_per_second": round(steady, 1) if steady else None,
        "mid_epoch_images_per_second": mid_epoch_images_per_second(later),
        "first_batch_seconds": [r.get("first_batch_seconds") for r in records],
        # the wait before each epoch for the previous one's last.ckpt (None: a process's first epoch, or not recorded)
        "since_previous_epoch_seconds": [r.get("since_previous_epoch_seconds") for r in records],
        "epoch0_seconds": first["train_seconds"],
        "epoch0_overhead_seconds": round(first["train_seconds"] - first["images"] / steady, 1) if steady else None,
        "first_validation_seconds": first["val_seconds"],
        "peak_memory_gb": max(r["peak_memory_gb"] for r in records),
    }


def job_seconds(benchmarks: Path) -> dict[str, float]:
    """Each job's wall seconds from Snakemake's `benchmark:` files (<rule folder>/<name>.tsv, column `s`)."""
    seconds = {}
    for tsv in sorted(benchmarks.rglob("*.tsv")):
        with open(tsv) as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        seconds[f"{tsv.parent.name}/{tsv.stem}"] = round(float(rows[-1]["s"]), 1)
    return seconds


def run_logged(command: list[str], log: Path, env: dict[str, str], cwd: Path = REPO) -> float:
    started = time.perf_counter()
    with open(log, "w") as handle:
        subprocess.run(command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, check=True)
    return round(time.perf_counter() - started, 1)


def run_stock(dataset: Path, out: Path, epochs: int, batch: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(out / "cache" / "inductor"),
        "TRITON_CACHE_DIR": str(out / "cache" / "triton"),
    }
    command = [sys.executable, "-m", "bench.stock_recipe", "--dataset", str(dataset), "--output", str(out)]
    wall = run_logged(command + ["--epochs", str(epochs), "--batch", str(batch)], out / "stock.log", env)
    return stock_summary(out / "epochs.jsonl", wall)


def stock_summary(epochs_jsonl: Path, wall: float | None) -> dict[str, Any]:
    """A stock run's summary from its EpochLog `epochs.jsonl` (wall: the process's seconds, None when unknown)."""
    records = [json.loads(line) for line in epochs_jsonl.read_text().splitlines()]
    return {"wall_seconds": wall, **summarize(records), "records": records}


def run_pipeline(
    dataset: Path,
    out: Path,
    epochs: int,
    per_block: int,
    gpus: int,
    profile: str,
    overrides: dict[str, Any],
    bench_profile: dict[str, Any] | None = None,
    compile_warmup: bool = False,
    train_only: bool = False,
) -> dict[str, Any]:
    """The workflow through `snakemake` on `dataset` (linked in as already extracted). With `compile_warmup`, its
    compile_warmup rule runs first, as it does beside the download of a real first run (the rule joins the run only
    while train2017 has yet to be extracted, rules/common.smk). With `train_only`, snakemake is asked for the train
    blocks alone: no evaluate, export or plot job after them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(exist_ok=True)
    link = out / "data" / "coco2017"
    if not link.exists():
        link.symlink_to(dataset.resolve())
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["verify"]["expected_images"] = {s: count_images(dataset / s) for s in ("train2017", "val2017")}
    config["train"].update(epochs=epochs, epochs_per_block=per_block, gpus=gpus, profile=profile, **overrides)
    if bench_profile:  # a benchmark-only gpu_profiles row: the GPU's own settings with some of them changed
        config["gpu_profiles"].append({"name": "bench", "auto": False, **bench_profile})
        config["train"]["profile"] = "bench"
    config["stage"]["subdir"] = f"bench-{out.name}"
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(out)]
    command += ["--configfile", str(out / "config.yaml"), "--cores", "all"]
    wall = 0.0
    if compile_warmup:
        warmup_target = "results/train/compile_warmup.json"
        wall += run_logged([*command, warmup_target], out / "snakemake-warmup.log", dict(os.environ), cwd=out)
    blocks = [out / "results" / "train" / block_name(i + 1) for i in range(len(block_ranges(epochs, per_block)))]
    targets = [str(block.relative_to(out) / "epochs.json") for block in blocks] if train_only else []
    wall += run_logged([*command, *targets], out / "snakemake.log", dict(os.environ), cwd=out)
    per_block_records = [read_json(b / "epochs.json") for b in blocks]
    summary = summarize(per_block_records[0])  # the first block: a cold compile cache
    if len(blocks) > 1:
        warm = summarize(per_block_records[1])
        summary["warm_epoch0_overhead_seconds"] = warm["epoch0_overhead_seconds"]
        summary["warm_first_validation_seconds"] = warm["first_validation_seconds"]
        steadies = [s["steady_images_per_second"] for s in (summary, warm) if s["steady_images_per_second"]]
        summary["steady_images_per_second"] = round(sum(steadies) / len(steadies), 1) if steadies else None
    run = read_json(blocks[0] / "run.json")
    warmup = out / "results" / "train" / "compile_warmup.json"
    return {
        "wall_seconds": wall,
        "job_seconds": job_seconds(out / "results" / "benchmarks"),
        "compile_warmup": read_json(warmup) if warmup.is_file() else None,
        **summary,
        "profile": run["profile"],
        "profile_reason": run["profile_reason"],
        "device": run["device"],
        "staged": read_json(blocks[0] / "stage.json")["where"],
        # the copy to the RAM disk, when this run made one (a real run's later blocks reuse it)
        "stage_seconds": read_json(blocks[0] / "stage.json").get("seconds"),
        "records": [r for records in per_block_records for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--only", choices=["stock", "pipeline"])
    parser.add_argument("--stock-epochs", type=int, default=2)
    parser.add_argument("--stock-batch", type=int, default=128)
    parser.add_argument("--pipeline-epochs", type=int, default=4)
    parser.add_argument("--epochs-per-block", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--profile", default="auto", help="a gpu_profiles row of config.yaml")
    parser.add_argument(
        "--bench-profile",
        type=json.loads,
        help='a profile row for this run only, as JSON: {"batch_size": 128, "precision": "bf16", "compile": true, '
        '"cuda_graphs": true}',
    )
    parser.add_argument("--train", type=json.loads, default={}, help='train settings to change, as JSON: {"lr": 2e-4}')
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script without a GPU")
    parser.add_argument("--resolution", type=int, default=384)
    parser.add_argument("--name", default="pipeline", help="subfolder of --out for the workflow run")
    parser.add_argument(
        "--compile-warmup", action="store_true", help="run the compile_warmup rule first, as beside a download"
    )
    parser.add_argument("--train-only", action="store_true", help="the train blocks only: no evaluate, export, plot")
    args = parser.parse_args()
    summary_path = args.out / "summary.json"
    summary = read_json(summary_path) if summary_path.exists() else {}
    if args.only in (None, "stock"):
        summary["stock"] = run_stock(args.dataset, args.out / "stock", args.stock_epochs, args.stock_batch)
    if args.only in (None, "pipeline"):
        summary[args.name] = run_pipeline(
            args.dataset,
            args.out / args.name,
            args.pipeline_epochs,
            args.epochs_per_block,
            args.gpus,
            args.profile,
            {"device": args.device, "resolution": args.resolution, **args.train},
            args.bench_profile,
            args.compile_warmup,
            args.train_only,
        )
    if "stock" in summary and args.name in summary:
        for rate, suffix in (("steady_images_per_second", ""), ("mid_epoch_images_per_second", "_mid_epoch")):
            if summary[args.name].get(rate) and summary["stock"].get(rate):
                summary[f"{args.name}_over_stock{suffix}"] = round(summary[args.name][rate] / summary["stock"][rate], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2))
    print(
        json.dumps(
            {
                k: {kk: vv for kk, vv in v.items() if kk != "records"} if isinstance(v, dict) else v
                for k, v in summary.items()
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

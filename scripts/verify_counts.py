"""Check the extracted dataset before any GPU time is spent on it, and write a small JSON report.

Checks, per split: the image count matches the config, the annotation file exists and parses, every
annotated image exists, and (optionally) every image decodes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image
from tqdm import tqdm

from pipeline.common import StageError, log, run_main, write_json
from pipeline.dataset import IMAGE_SUFFIX, count_images


def redo_hint(dataset: Path, split: str) -> str:
    return (
        f"Fetch and extract it again with: snakemake --cores all --forcerun {dataset / split} "
        f"(and for the annotations: --forcerun {dataset / 'annotations'})."
    )


def load_annotations(path: Path, dataset: Path, split: str) -> dict[str, Any]:
    if not path.is_file():
        raise StageError(f"{split}: the annotation file {path} is missing. {redo_hint(dataset, 'annotations')}")
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise StageError(
            f"{split}: the annotation file {path} is not valid JSON ({error}). {redo_hint(dataset, 'annotations')}"
        ) from error
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise StageError(f"{split}: {path} has no 'images' list; it is not a COCO annotation file.")
    return data


def missing_images(annotations: Mapping[str, Any], folder: Path) -> list[str]:
    present = {e.name for e in os.scandir(folder)}
    return [img["file_name"] for img in annotations["images"] if img.get("file_name") not in present]


def _decode(path: str) -> str | None:
    """Decode one image fully; return an error text, or None when it is fine."""
    try:
        with Image.open(path) as image:
            # Decoding at 1/8 scale still reads every byte of the JPEG stream, at a fraction of the cost.
            image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
            image.load()
    except Exception as error:  # any decoder failure means training would crash on this file
        return f"{Path(path).name}: {error}"
    return None


def undecodable_images(paths: Sequence[Path], workers: int) -> list[str]:
    with ProcessPoolExecutor(max(1, workers)) as pool:
        results = pool.map(_decode, [str(p) for p in paths], chunksize=256)
        return [r for r in tqdm(results, total=len(paths), desc="decode", unit="img", mininterval=5.0) if r]


def verify_split(dataset: Path, split: str, expected: int, decode: bool, workers: int) -> dict[str, Any]:
    folder = dataset / split
    if not folder.is_dir():
        raise StageError(f"{split}: the folder {folder} is missing. {redo_hint(dataset, split)}")
    found = count_images(folder)
    if found != expected:
        raise StageError(
            f"{split}: found {found} images in {folder}, expected {expected} "
            f"(verify.expected_images.{split} in config.yaml). A download or extraction went wrong, or the "
            f"disk filled up (check df -h). {redo_hint(dataset, split)}"
        )
    annotation_file = dataset / "annotations" / f"instances_{split}.json"
    annotations = load_annotations(annotation_file, dataset, split)
    missing = missing_images(annotations, folder)
    if missing:
        raise StageError(
            f"{split}: {len(missing)} annotated image(s) are missing from {folder}, e.g. "
            f"{', '.join(missing[:5])}. {redo_hint(dataset, split)}"
        )
    broken: list[str] = []
    if decode:
        broken = undecodable_images(sorted(folder.glob(f"*{IMAGE_SUFFIX}")), workers)
        if broken:
            raise StageError(
                f"{split}: {len(broken)} image(s) do not decode: {'; '.join(broken[:5])}. {redo_hint(dataset, split)}"
            )
    log.info("%s: %d images, %d annotations: OK", split, found, len(annotations.get("annotations", [])))
    return {
        "folder": str(folder),
        "images": found,
        "expected_images": expected,
        "annotation_file": str(annotation_file),
        "annotated_images": len(annotations["images"]),
        "annotations": len(annotations.get("annotations", [])),
        "decoded": decode,
    }


def verify_dataset(dataset: Path, expected: Mapping[str, int], decode: bool, workers: int) -> dict[str, Any]:
    start = time.perf_counter()
    splits = {split: verify_split(dataset, split, count, decode, workers) for split, count in expected.items()}
    return {"dataset": str(dataset), "splits": splits, "seconds": round(time.perf_counter() - start, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--expected", required=True, help='JSON, e.g. {"train2017": 118287, "val2017": 5000}')
    parser.add_argument("--decode", action="store_true", help="decode every image")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--report", required=True, type=Path)
    args = parser.parse_args()
    report = verify_dataset(args.dataset, json.loads(args.expected), args.decode, args.workers)
    write_json(args.report, report)


if __name__ == "__main__":
    run_main(main)

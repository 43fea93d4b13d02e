"""Check the extracted dataset before any GPU time is spent on it, and write a small JSON report.

Checks, per split: the image count matches the config, the annotation file exists and parses, every
annotated image exists, no image file is missing from the annotations (verify.unlisted_images: error or warn), and
(optionally) every image decodes. The report gives, per split, the image files, the images the annotations list
(and how many of those have no annotation, as some of COCO's own do), and the files they do not list.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image
from tqdm import tqdm

from rfdetr_coco_pipeline.common import StageError, log
from rfdetr_coco_pipeline.data.dataset import IMAGE_SUFFIX, count_images


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


def unlisted_images(annotations: Mapping[str, Any], folder: Path) -> list[str]:
    """Image files in `folder` that the annotation file does not list: counted, but never trained on."""
    listed = {img.get("file_name") for img in annotations["images"]}
    return sorted(e.name for e in os.scandir(folder) if e.name.endswith(IMAGE_SUFFIX) and e.name not in listed)


def verify_split(
    dataset: Path, split: str, expected: int, decode: bool, workers: int, unlisted_policy: str = "error"
) -> dict[str, Any]:
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
    unlisted = unlisted_images(annotations, folder)
    if unlisted:
        text = (
            f"{split}: {len(unlisted)} image file(s) in {folder} are not listed in {annotation_file.name}, so training "
            f"never sees them although verify.expected_images counts them, e.g. {', '.join(unlisted[:5])}. Remove "
            "them, or set verify.unlisted_images: warn in config.yaml to go on."
        )
        if unlisted_policy == "error":
            raise StageError(text)
        log.warning("%s", text)
    with_annotations = {a.get("image_id") for a in annotations.get("annotations", [])}
    without = sum(1 for img in annotations["images"] if img.get("id") not in with_annotations)
    broken: list[str] = []
    if decode:
        broken = undecodable_images(sorted(folder.glob(f"*{IMAGE_SUFFIX}")), workers)
        if broken:
            raise StageError(
                f"{split}: {len(broken)} image(s) do not decode: {'; '.join(broken[:5])}. {redo_hint(dataset, split)}"
            )
    log.info(
        "%s: %d image files, %d listed in %s (%d of them without annotations), %d not listed, %d annotations: OK",
        split,
        found,
        len(annotations["images"]),
        annotation_file.name,
        without,
        len(unlisted),
        len(annotations.get("annotations", [])),
    )
    return {
        "folder": str(folder),
        "images": found,
        "expected_images": expected,
        "annotation_file": str(annotation_file),
        "annotated_images": len(annotations["images"]),
        "images_without_annotations": without,
        "unlisted_images": len(unlisted),
        "unlisted_examples": unlisted[:20],
        "annotations": len(annotations.get("annotations", [])),
        "decoded": decode,
    }


def verify_dataset(
    dataset: Path, expected: Mapping[str, int], decode: bool, workers: int, unlisted_policy: str = "error"
) -> dict[str, Any]:
    """The report of every split's checks (see the module's text); StageError at the first failed check."""
    start = time.perf_counter()
    splits = {
        split: verify_split(dataset, split, count, decode, workers, unlisted_policy)
        for split, count in expected.items()
    }
    return {"dataset": str(dataset), "splits": splits, "seconds": round(time.perf_counter() - start, 2)}

"""A tiny COCO2017-layout dataset, zipped as the three official archives, for the workflow tests."""

from __future__ import annotations

import hashlib
import json
import random
import zipfile
from pathlib import Path

from PIL import Image, ImageDraw

COCO_IDS = [i for i in range(1, 91) if i not in {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}]
SPLITS = {"train2017": 0, "val2017": 1_000_000}
ARCHIVE_FOLDERS = {"annotations_trainval2017": "annotations", "val2017": "val2017", "train2017": "train2017"}


def make_split(root: Path, split: str, count: int, seed: int) -> None:
    """Write `count` small JPEGs with 1-3 boxes each and their instances_<split>.json."""
    rng = random.Random(seed)
    (root / split).mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(count):
        image_id = SPLITS[split] + i + 1
        width, height = rng.choice([(96, 64), (80, 80), (64, 96)])
        image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for _ in range(rng.randint(1, 3)):
            w, h = rng.randint(12, width // 2), rng.randint(12, height // 2)
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            draw.rectangle([x, y, x + w, y + h], fill=tuple(rng.randrange(256) for _ in range(3)))
            annotations.append(
                {
                    "id": len(annotations) + 1 + SPLITS[split],
                    "image_id": image_id,
                    "category_id": rng.choice(COCO_IDS),
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]],  # as COCO's: one polygon
                }
            )
        name = f"{image_id:012d}.jpg"
        image.save(root / split / name, quality=90)
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
    categories = [{"id": c, "name": f"class{c}", "supercategory": "thing"} for c in COCO_IDS]
    (root / "annotations").mkdir(exist_ok=True)
    with open(root / "annotations" / f"instances_{split}.json", "w") as handle:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, handle)


def make_dataset(root: Path, n_train: int = 8, n_val: int = 4) -> Path:
    make_split(root, "train2017", n_train, seed=1)
    make_split(root, "val2017", n_val, seed=2)
    return root


def zip_folder(source_root: Path, folder: str, archive: Path) -> None:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(source_root / folder, f"{folder}/")
        for path in sorted((source_root / folder).rglob("*")):
            zf.write(path, path.relative_to(source_root).as_posix())


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def make_archives(dataset_root: Path, out_dir: Path) -> dict[str, dict]:
    """Zip the dataset as the three COCO archives; return name -> {path, md5, size, folder, extracted}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    archives = {}
    for name, folder in ARCHIVE_FOLDERS.items():
        archive = out_dir / f"{name}.zip"
        zip_folder(dataset_root, folder, archive)
        extracted = sum(p.stat().st_size for p in (dataset_root / folder).rglob("*") if p.is_file())
        archives[name] = {
            "path": archive,
            "md5": md5(archive),
            "size": archive.stat().st_size,
            "folder": folder,
            "extracted": extracted,
        }
    return archives

"""Write a synthetic dataset in the COCO2017 layout (train2017/, val2017/, annotations/).

usage: python3 bench/synth_coco.py ROOT N_TRAIN N_VAL [--detail photo|coco] [--workers N]

Images are photo-like JPEGs (smooth background, filled shapes, sensor noise) of COCO's usual sizes (640x480,
612x612, 500x375, ...), with 1-11 boxes each over COCO's 80 category ids. `--detail` sets how much fine detail
they carry, which sets their bytes and the loader's decode cost:

- `photo` (default): one noise level; about 71 kB an image on average, the set earlier benchmarks used;
- `coco`: texture at three finer scales under stronger noise, about 160 kB an image on average, as COCO2017's
  train2017 (18.0 GB for 118,287 images: 163 kB each on average).

`--distinct-train K` writes K distinct train images and fills the rest of N_TRAIN with hard links to them (each with
its own id, file name and copy of its boxes): a set of COCO's full size (118,287 train images) in a tenth of the
time, for measuring whole epochs at COCO's length. The loader decodes every file as it would a distinct one.

`tests/test_bench.py` checks both averages on a small set, and the hard-linked fill.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageDraw

COCO_IDS = [i for i in range(1, 91) if i not in {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}]
# (cells across, amplitude) of each texture scale, and the per-pixel noise, for each --detail
DETAIL = {"photo": ((), 10.0), "coco": (((40, 40.0), (160, 30.0), (320, 20.0)), 15.5)}


def texture(rng: np.random.Generator, width: int, height: int, cells: int, amplitude: float) -> np.ndarray:
    """Smooth random variation with `cells` features across the image: edges and surfaces at one scale."""
    grid = rng.uniform(-amplitude, amplitude, size=(max(2, cells * height // width), cells, 3)).astype(np.float32)
    channels = [Image.fromarray(grid[..., c], mode="F").resize((width, height), Image.BICUBIC) for c in range(3)]
    return np.stack([np.asarray(c) for c in channels], axis=-1)


def make_image(job: tuple[str, int], detail: str = "photo") -> tuple[int, int, list[dict]]:
    """Write one JPEG at `path` from `seed`; return its width, height and boxes (COCO xywh)."""
    path, seed = job
    scales, noise = DETAIL[detail]
    rng = np.random.default_rng(seed)
    w, h = int(rng.choice([640, 640, 612, 500])), int(rng.choice([480, 427, 640, 375]))
    grid = rng.uniform(0, 255, size=(6, 8, 3)).astype(np.float32)
    bg = np.array(Image.fromarray(grid.astype(np.uint8)).resize((w, h), Image.BILINEAR), dtype=np.float32)
    if not scales:
        bg += rng.normal(0, noise, size=bg.shape)
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    anns = []
    for _ in range(int(rng.integers(1, 12))):
        bw, bh = rng.uniform(0.05, 0.6) * w, rng.uniform(0.05, 0.6) * h
        x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        color = tuple(int(c) for c in rng.integers(0, 255, 3))
        if rng.random() < 0.5:
            draw.rectangle([x, y, x + bw, y + bh], fill=color)
        else:
            draw.ellipse([x, y, x + bw, y + bh], fill=color)
        anns.append({"bbox": [float(x), float(y), float(bw), float(bh)], "category_id": int(rng.choice(COCO_IDS))})
    if scales:  # texture over the shapes too, as objects in photos have it
        pixels = np.asarray(img, dtype=np.float32)
        for cells, amplitude in scales:
            pixels += texture(rng, w, h, cells, amplitude)
        pixels += rng.normal(0, noise, size=pixels.shape)
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    img.save(path, quality=90)
    return w, h, anns


def split(
    root: str,
    name: str,
    n: int,
    offset: int,
    detail: str = "photo",
    workers: int | None = None,
    distinct: int | None = None,
) -> None:
    """Write `n` images of split `name` (ids from `offset`) and its annotation file; with `distinct`, only that many
    are drawn and the others are hard links to them, in turn."""
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    drawn = min(n, distinct or n)
    jobs = [(os.path.join(folder, f"{offset + i:012d}.jpg"), offset + i) for i in range(drawn)]
    with Pool(workers or os.cpu_count()) as pool:
        results = pool.map(partial(make_image, detail=detail), jobs, chunksize=64)
    for i in range(drawn, n):
        os.link(jobs[i % drawn][0], os.path.join(folder, f"{offset + i:012d}.jpg"))
    images, annotations = [], []
    for i, (w, h, anns) in enumerate(results[i % drawn] for i in range(n)):
        image_id = offset + i
        images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg", "width": w, "height": h})
        for a in anns:
            bw, bh = a["bbox"][2], a["bbox"][3]
            annotations.append(
                {"id": len(annotations) + 1 + offset * 20, "image_id": image_id, "iscrowd": 0, "area": bw * bh, **a}
            )
    cats = [{"id": c, "name": f"class{c}", "supercategory": "thing"} for c in COCO_IDS]
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    with open(os.path.join(root, "annotations", f"instances_{name}.json"), "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": cats}, f)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("n_train", type=int)
    parser.add_argument("n_val", type=int)
    parser.add_argument("--detail", choices=sorted(DETAIL), default="photo")
    parser.add_argument("--workers", type=int, help="processes (default: every core)")
    parser.add_argument("--distinct-train", type=int, help="draw this many train images; hard-link the rest to them")
    args = parser.parse_args(argv)
    split(args.root, "train2017", args.n_train, 1, args.detail, args.workers, args.distinct_train)
    split(args.root, "val2017", args.n_val, 10_000_000, args.detail, args.workers)


if __name__ == "__main__":
    main()

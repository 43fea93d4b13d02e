"""Write a synthetic dataset in the COCO2017 layout (train2017/, val2017/, annotations/).

Images are photo-like JPEGs (smooth background, texture noise, filled shapes) so that
decode cost and file size are close to real COCO images (~640x480, 100-200 KB).
"""

import json
import os
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageDraw

COCO_IDS = [i for i in range(1, 91) if i not in {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}]


def make_image(args):
    path, seed = args
    rng = np.random.default_rng(seed)
    w, h = int(rng.choice([640, 640, 612, 500])), int(rng.choice([480, 427, 640, 375]))
    grid = rng.uniform(0, 255, size=(6, 8, 3)).astype(np.float32)
    bg = np.array(Image.fromarray(grid.astype(np.uint8)).resize((w, h), Image.BILINEAR), dtype=np.float32)
    bg += rng.normal(0, 10, size=bg.shape)
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
    img.save(path, quality=90)
    return w, h, anns


def split(root, name, n, offset):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    jobs = [(os.path.join(root, name, f"{offset + i:012d}.jpg"), offset + i) for i in range(n)]
    with Pool(os.cpu_count()) as pool:
        results = pool.map(make_image, jobs, chunksize=64)
    images, annotations = [], []
    for i, (w, h, anns) in enumerate(results):
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


if __name__ == "__main__":
    root, n_train, n_val = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    split(root, "train2017", n_train, 1)
    split(root, "val2017", n_val, 10_000_000)

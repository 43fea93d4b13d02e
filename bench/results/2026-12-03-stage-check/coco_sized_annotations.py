"""A COCO-sized instances_train2017.json: 118,287 images, 860,001 annotations, each with one 23-point polygon.

usage: python bench/results/2026-12-03-stage-check/coco_sized_annotations.py OUT.json   (about 441 MB)
"""

import json
import random
import sys

random.seed(0)
images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 640, "height": 480} for i in range(118287)]
anns = []
for k in range(860001):
    x, y = random.uniform(0, 500), random.uniform(0, 400)
    poly = [round(random.uniform(0, 640), 2) for _ in range(46)]
    anns.append(
        {
            "segmentation": [poly],
            "area": round(random.uniform(10, 50000), 4),
            "iscrowd": 0,
            "image_id": random.randrange(118287),
            "bbox": [round(x, 2), round(y, 2), 55.12, 43.07],
            "category_id": random.randrange(1, 91),
            "id": k,
        }
    )
cats = [{"id": i, "name": f"c{i}", "supercategory": "x"} for i in range(1, 91)]
json.dump({"images": images, "annotations": anns, "categories": cats}, open(sys.argv[1], "w"))

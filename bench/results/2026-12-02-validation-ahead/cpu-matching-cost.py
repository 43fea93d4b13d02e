"""Seconds rfdetr's F1 matching (`rfdetr.evaluation.matching.build_matching_data`, what `matching_in_workers` runs in
its workers) takes for one validation batch of 125 images x 300 detections (80 classes, 7 boxes of ground truth
each), on this host's one thread: the mean of 3 runs after a first.
usage: PYTHONPATH=. python bench/results/2026-12-02-validation-ahead/cpu-matching-cost.py
"""

import json
import time

import torch
from rfdetr.evaluation.matching import build_matching_data

generator = torch.Generator().manual_seed(0)
preds, targets = [], []
for _ in range(125):
    corner = torch.rand(7, 2, generator=generator) * 300
    truth = torch.cat([corner, corner + 20 + torch.rand(7, 2, generator=generator) * 80], 1)
    boxes = truth.repeat(43, 1)[:300] + torch.randn(300, 4, generator=generator) * 15
    preds.append(
        {
            "boxes": boxes,
            "scores": torch.rand(300, generator=generator),
            "labels": torch.randint(0, 80, (300,), generator=generator),
        }
    )
    targets.append(
        {
            "boxes": truth,
            "labels": torch.randint(0, 80, (7,), generator=generator),
            "iscrowd": torch.zeros(7, dtype=torch.long),
        }
    )
build_matching_data(preds, targets, iou_threshold=0.5, iou_type="bbox")
start = time.perf_counter()
for _ in range(3):
    build_matching_data(preds, targets, iou_threshold=0.5, iou_type="bbox")
print(json.dumps({"seconds_per_batch_of_125_images": round((time.perf_counter() - start) / 3, 3)}))

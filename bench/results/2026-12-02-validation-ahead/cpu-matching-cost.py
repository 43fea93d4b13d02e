"""Seconds rfdetr's F1 matching (`rfdetr.evaluation.matching.build_matching_data`, what `matching_in_workers` runs in
its workers) takes for one validation batch of 125 images x 300 detections (80 classes, 7 boxes of ground truth
each), on this host's one thread: the mean of 3 runs after a first.
usage: PYTHONPATH=. python bench/results/2026-12-02-validation-ahead/cpu-matching-cost.py
"""

import json
import time

import torch
from rfdetr.evaluation.matching import build_matching_data

from bench.synth_detections import validation_batch

generator = torch.Generator().manual_seed(0)
preds, targets = validation_batch(generator)
build_matching_data(preds, targets, iou_threshold=0.5, iou_type="bbox")
start = time.perf_counter()
for _ in range(3):
    build_matching_data(preds, targets, iou_threshold=0.5, iou_type="bbox")
print(json.dumps({"seconds_per_batch_of_125_images": round((time.perf_counter() - start) / 3, 3)}))

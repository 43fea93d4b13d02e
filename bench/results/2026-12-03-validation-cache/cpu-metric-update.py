"""rfdetr's COCO metric update (`OnePassCocoMeanAveragePrecision.update`, as its validation callback calls it) over
40 batches of 125 synthetic images (`bench.synth_detections`: 300 detections and 7 boxes of ground truth each), one
torch thread as the train stage sets it on a GPU; three timings, then cProfile's top functions of a fourth. Host work
only: how much of a validation's per-batch callback time is the metric's per-image update.
usage: PYTHONPATH=. python bench/results/2026-12-03-validation-cache/cpu-metric-update.py
"""

import cProfile
import json
import os
import pstats
import time

import torch
from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision

from bench.synth_detections import validation_batch

torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
batches = [validation_batch(generator) for _ in range(40)]


def timed_update() -> float:
    metric = OnePassCocoMeanAveragePrecision(
        iou_type="bbox", class_metrics=True, max_detection_thresholds=[1, 10, 500], backend="vernier"
    )
    start = time.perf_counter()
    for preds, targets in batches:
        metric.update(preds, targets)
    return time.perf_counter() - start


seconds = [round(timed_update(), 3) for _ in range(3)]
profile = cProfile.Profile()
profile.enable()
timed_update()
profile.disable()
stats = pstats.Stats(profile).sort_stats("cumulative")
top = sorted(stats.stats.items(), key=lambda item: -item[1][3])[:12]  # (file, line, name) -> (cc, nc, tt, ct, callers)
print(
    json.dumps(
        {
            "cpus": len(os.sched_getaffinity(0)),
            "images": 40 * 125,
            "update_seconds": seconds,
            "profiled_cumulative_seconds": [
                [f"{os.path.basename(file)}:{name}", calls, round(cumulative, 3)]
                for (file, _, name), (_, calls, _, cumulative, _) in top
            ],
        },
        indent=1,
    )
)

"""rfdetr's COCO metric at a validation's end (`OnePassCocoMeanAveragePrecision.compute`, vernier) over 5,000
synthetic images (`bench.synth_detections`: 40 batches of 125, 300 detections each), on the host's cores as
`evaluation_on_every_core` gives them; then cProfile's largest functions of a second computation. Host work only:
what the epoch end of a validation spends in the COCO evaluation.
usage: PYTHONPATH=. python bench/results/2026-12-03-metric-per-batch/cpu-epoch-end.py
"""

import cProfile
import json
import os
import pstats
import time

import torch
from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision
from rfdetr_extensions.patches.evaluation_on_every_core import evaluation_on_every_core

from bench.synth_detections import validation_batch


def filled_metric(batches: list) -> OnePassCocoMeanAveragePrecision:
    metric = OnePassCocoMeanAveragePrecision(
        iou_type="bbox", class_metrics=True, max_detection_thresholds=[1, 10, 500], backend="vernier"
    )
    for preds, targets in batches:
        metric.update(preds, targets)
    return metric


if __name__ == "__main__":
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    batches = [validation_batch(generator) for _ in range(40)]
    with evaluation_on_every_core():
        metric = filled_metric(batches)
        start = time.perf_counter()
        metric.compute()
        seconds = time.perf_counter() - start
        metric = filled_metric(batches)
        profile = cProfile.Profile()
        profile.enable()
        metric.compute()
        profile.disable()
    stats = pstats.Stats(profile)
    top = sorted(stats.stats.items(), key=lambda item: -item[1][3])[:10]
    print(
        json.dumps(
            {
                "cpus": len(os.sched_getaffinity(0)),
                "images": 40 * 125,
                "compute_seconds": round(seconds, 3),
                "profiled_cumulative_seconds": [
                    [f"{os.path.basename(file)}:{name}", calls, round(cumulative, 3)]
                    for (file, _, name), (_, calls, _, cumulative, _) in top
                ],
            },
            indent=1,
        )
    )

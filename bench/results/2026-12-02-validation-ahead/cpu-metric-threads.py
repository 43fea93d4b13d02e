"""rfdetr's COCO evaluation of 5,000 images x 300 detections (80 classes, 7 boxes of ground truth each), vernier
backend as its validation callback builds it, timed with one thread (what rfdetr hands vernier when the train stage
has set torch's threads to train.host_threads: 1 on a GPU) and with every core of the host (rfdetr's private
`_vernier_thread_budget` replaced for the second run), alternating twice in one process, same data; checks that the
metrics are equal. An idea measured, not a speedup of the workflow.
usage: PYTHONPATH=. python bench/results/2026-12-02-validation-ahead/cpu-metric-threads.py
"""

import json
import os
import time

import torch
from rfdetr.training import coco_map
from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision

from bench.synth_detections import validation_batch


def filled_metric(seed: int = 0) -> OnePassCocoMeanAveragePrecision:
    generator = torch.Generator().manual_seed(seed)
    metric = OnePassCocoMeanAveragePrecision(
        iou_type="bbox",
        class_metrics=True,
        max_detection_thresholds=[1, 10, 500],
        backend="vernier",
        sync_on_compute=False,
    )
    for _ in range(40):  # 40 batches of 125 images
        preds, targets = validation_batch(generator)
        metric.update(preds, targets)
    return metric


def timed_compute() -> tuple[float, dict]:
    metric = filled_metric()
    start = time.perf_counter()
    result = metric.compute()
    return time.perf_counter() - start, result


torch.set_num_threads(1)
one_thread, cores = [], []
for _ in range(2):  # alternating, so that neither side gets only the first (colder) computation
    seconds, rfdetrs = timed_compute()
    one_thread.append(seconds)
    rfdetrs_budget = coco_map._vernier_thread_budget
    coco_map._vernier_thread_budget = lambda: len(os.sched_getaffinity(0))
    try:
        seconds, ours = timed_compute()
    finally:
        coco_map._vernier_thread_budget = rfdetrs_budget
    cores.append(seconds)
same = rfdetrs.keys() == ours.keys() and all(
    torch.equal(torch.as_tensor(v), torch.as_tensor(ours[k])) for k, v in rfdetrs.items()
)
print(
    json.dumps(
        {
            "cpus": len(os.sched_getaffinity(0)),
            "one_thread_seconds": [round(x, 2) for x in one_thread],
            "every_core_seconds": [round(x, 2) for x in cores],
            "ratio_of_the_faster_of_each": round(min(one_thread) / min(cores), 2),
            "metrics_equal": same,
            "map": float(rfdetrs["map"]),
        }
    )
)

"""rfdetr's validation batch callback (`COCOEvalCallback.on_validation_batch_end`) over 40 batches of 125 synthetic
images (`bench.synth_detections`: 300 detections and 7 boxes of ground truth each, targets as the loader gives them),
one torch thread as the train stage sets it on a GPU, with `matching_in_workers` as the train stage has it, without
and with `metric_update_per_batch`: three timings each, alternating. Host work only.
usage: PYTHONPATH=. python bench/results/2026-12-03-metric-per-batch/cpu-callback.py
"""

import json
import os
import time
import types
from contextlib import ExitStack

import torch
from rfdetr.training.callbacks.coco_eval import COCOEvalCallback
from rfdetr_extensions.patches.matching_in_workers import matching_in_workers
from rfdetr_extensions.patches.metric_update_per_batch import metric_update_per_batch

from bench.synth_detections import validation_batch


def loader_targets(targets: list[dict], first_id: int) -> list[dict]:
    """The synthetic targets as the validation loader gives them: normalised cxcywh boxes, sizes, ids."""
    converted = []
    for index, target in enumerate(targets):
        xyxy = target["boxes"] / 640
        cxcywh = torch.cat([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1)
        converted.append(
            {
                "boxes": cxcywh,
                "labels": target["labels"],
                "iscrowd": target["iscrowd"],
                "area": target["area"],
                "orig_size": torch.tensor([640, 640]),
                "size": torch.tensor([384, 384]),
                "image_id": torch.tensor(first_id + index),
            }
        )
    return converted


def timed_validation(batches: list[dict], per_batch: bool) -> float:
    trainer = types.SimpleNamespace(datamodule=None, callbacks=[])
    module = types.SimpleNamespace(device=torch.device("cpu"), model_config=None)
    with ExitStack() as stack:
        if per_batch:
            stack.enter_context(metric_update_per_batch())
        callback = COCOEvalCallback(max_dets=500)
        callback.setup(trainer, module, "fit")
        callback.on_validation_epoch_start(trainer, module)
        start = time.perf_counter()
        for index, outputs in enumerate(batches):
            callback.on_validation_batch_end(trainer, module, outputs, None, index)
        return time.perf_counter() - start


if __name__ == "__main__":
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    batches = []
    for number in range(40):
        preds, targets = validation_batch(generator)
        batches.append({"results": preds, "targets": loader_targets(targets, number * 125)})
    seconds: dict[str, list[float]] = {"rfdetr": [], "metric_update_per_batch": []}
    with matching_in_workers():
        timed_validation(batches, False)  # the workers' start, once
        for _ in range(3):
            seconds["rfdetr"].append(round(timed_validation(batches, False), 3))
            seconds["metric_update_per_batch"].append(round(timed_validation(batches, True), 3))
    print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "images": 40 * 125, "batch_callbacks_seconds": seconds}))

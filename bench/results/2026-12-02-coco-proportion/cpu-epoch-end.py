"""The validation epoch end on the host, for 5,000 synthetic images of 300 detections each: rfdetr's COCO metric per
backend, the F1 matching (on one process) and the F1 sweep. Run on the 2-core CPU host with
`python bench/results/2026-12-02-coco-proportion/cpu-epoch-end.py`; output in cpu-epoch-end.txt."""

import time

import numpy as np
import torch
from rfdetr.evaluation.f1_sweep import sweep_confidence_thresholds
from rfdetr.evaluation.matching import build_matching_data, merge_matching_data
from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision

IMAGES, DETECTIONS, BATCH = 5000, 300, 125


def synthetic_batch(generator: torch.Generator) -> tuple[dict, dict]:
    """One image: 7 ground-truth boxes, 240 detections scattered around them and 60 anywhere, over 80 classes."""
    corner = torch.rand(7, 2, generator=generator) * 400
    truth = torch.cat([corner, corner + 20 + torch.rand(7, 2, generator=generator) * 100], 1)
    near = truth.repeat(40, 1)[: DETECTIONS - 60] + torch.randn(DETECTIONS - 60, 4, generator=generator) * 10
    boxes = torch.cat([near, torch.rand(60, 4, generator=generator).sort(1).values * 500])
    boxes = torch.cat([boxes[:, :2], torch.maximum(boxes[:, 2:], boxes[:, :2] + 1)], 1)
    labels = torch.randint(0, 80, (DETECTIONS,), generator=generator)
    pred = {"boxes": boxes, "scores": torch.rand(DETECTIONS, generator=generator), "labels": labels}
    target = {"boxes": truth, "labels": torch.randint(0, 80, (7,), generator=generator), "iscrowd": torch.zeros(7)}
    return pred, target


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    pairs = [synthetic_batch(generator) for _ in range(IMAGES)]
    batches = [
        ([p for p, _ in pairs[i : i + BATCH]], [t for _, t in pairs[i : i + BATCH]]) for i in range(0, IMAGES, BATCH)
    ]
    for backend in ("vernier", "hotcoco", "faster_coco_eval"):
        metric = OnePassCocoMeanAveragePrecision(
            iou_type="bbox", max_detection_thresholds=[1, 10, 500], class_metrics=True, backend=backend
        )
        for preds, targets in batches:
            metric.update(preds, targets)
        start = time.perf_counter()
        result = metric.compute()
        seconds = time.perf_counter() - start
        map_50 = float(result["map_50"])
        print(f"{backend} compute {seconds:.2f} s, map {float(result['map']):.6f}, AP50 {map_50:.6f}")
    accumulator: dict = {}
    start = time.perf_counter()
    for preds, targets in batches:
        merge_matching_data(accumulator, build_matching_data(preds, targets))
    print(f"F1 matching on one process {time.perf_counter() - start:.2f} s")
    ids = sorted(accumulator)
    with_truth = [i for i, c in enumerate(ids) if accumulator[c]["total_gt"] > 0]
    start = time.perf_counter()
    sweep_confidence_thresholds([accumulator[c] for c in ids], np.linspace(0, 1, 101), with_truth)
    print(f"F1 sweep {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()

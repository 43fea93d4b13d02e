"""A synthetic validation batch at COCO's scale, for timing rfdetr's metric code on the host without a model.

`validation_batch(generator)` gives rfdetr's metric inputs for 125 images (the workflow's validation batch): per image
7 boxes of ground truth over 80 classes and 300 detections (Nano's `num_select`) scattered around them. Used by the
host-only measurements in `bench/results/2026-12-02-validation-ahead/` (`cpu-metric-threads.py`,
`cpu-matching-cost.py`).
"""

from __future__ import annotations

from typing import Any


def validation_batch(
    generator: Any, images: int = 125, detections: int = 300, truths: int = 7, classes: int = 80
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Predictions and targets as rfdetr's COCO metric and F1 matching receive them (boxes xyxy in pixels)."""
    import torch

    preds, targets = [], []
    for _ in range(images):
        corner = torch.rand(truths, 2, generator=generator) * 300
        truth = torch.cat([corner, corner + 20 + torch.rand(truths, 2, generator=generator) * 80], 1)
        repeats = detections // truths + 1
        boxes = truth.repeat(repeats, 1)[:detections] + torch.randn(detections, 4, generator=generator) * 15
        preds.append(
            {
                "boxes": boxes,
                "scores": torch.rand(detections, generator=generator),
                "labels": torch.randint(0, classes, (detections,), generator=generator),
            }
        )
        targets.append(
            {
                "boxes": truth,
                "labels": torch.randint(0, classes, (truths,), generator=generator),
                "iscrowd": torch.zeros(truths, dtype=torch.long),
                "area": torch.full((truths,), 5000.0),
            }
        )
    return preds, targets

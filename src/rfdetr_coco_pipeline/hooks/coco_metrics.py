"""Keep the whole result of rfdetr's COCO evaluation, not only the few numbers it logs.

rfdetr's `evaluate()` returns mAP@50:95, @50, @75, mAR and the per-class APs, but the metric it computes
(`COCOEvalCallback._compute_map_metric`, torchmetrics' `MeanAveragePrecision` over rfdetr's COCO backend) holds more:
AP for small, medium and large objects and AR at 1, 10 and 100 detections. `captured_coco_metrics()` wraps that one
method inside a `with` block and keeps every dictionary it returns, unchanged, so the evaluate stage reports
rfdetr's own numbers rather than computing them again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

# What `MeanAveragePrecision.compute()` calls each summary number (with rfdetr's prefix, "" for boxes).
SUMMARY_KEYS = {
    "AP": "map",
    "AP50": "map_50",
    "AP75": "map_75",
    "AP_small": "map_small",
    "AP_medium": "map_medium",
    "AP_large": "map_large",
    "AR1": "mar_1",
    "AR10": "mar_10",
    "AR100": "mar_100",
}


@contextmanager
def captured_coco_metrics() -> Iterator[list[dict[str, Any]]]:
    """Within this block, every COCO metric rfdetr computes is also appended, as computed, to the yielded list."""
    computed: list[dict[str, Any]] = []

    def keeping(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        def compute_map_metric(callback: Any, trainer: Any, metric: Any) -> dict[str, Any]:
            result = original(callback, trainer, metric)
            computed.append(result)
            return result

        return compute_map_metric

    with patch_rfdetr("rfdetr.training.callbacks.coco_eval:COCOEvalCallback", "_compute_map_metric", keeping):
        yield computed


def summary(metrics: dict[str, Any]) -> dict[str, float]:
    """The COCO summary numbers of one computed metric, as plain floats keyed AP, AP50, ..., AR100."""
    return {name: float(metrics[key]) for name, key in SUMMARY_KEYS.items()}


def per_class_ap(metrics: dict[str, Any]) -> dict[int, float]:
    """AP@50:95 per label of one computed metric (the label is the COCO category id with dataset_file="coco");
    labels without ground truth in the split (AP -1) are left out."""
    classes = [int(label) for label in metrics["classes"].reshape(-1).tolist()]
    values = [float(ap) for ap in metrics["map_per_class"].reshape(-1).tolist()]
    return {label: ap for label, ap in zip(classes, values, strict=True) if ap >= 0}

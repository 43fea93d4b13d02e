"""Convert a validation batch's boxes for the COCO metric in one operation per batch, not a few per image.

rfdetr's `COCOEvalCallback` hands each validation batch to its COCO metric image by image:
`_convert_targets` turns every image's normalised cxcywh boxes into pixel xyxy with its own `box_cxcywh_to_xyxy`
and scale, and `OnePassCocoMeanAveragePrecision.update` (torchmetrics' `MeanAveragePrecision.update` underneath)
converts every image's predicted and true boxes to xywh with its own `box_convert`. At a batch of 125 that is some
3,000 small tensor operations a batch on the training process's one thread, which the GPU and the loader wait for.

Within this block both run once per batch for the plain box case: every image's boxes are concatenated, converted
by the same functions (`box_cxcywh_to_xyxy` times each row's image scale; torchvision's `box_convert`), and split
back per image, each image's boxes a copy of their own as rfdetr's are (DDP's `merge_distributed_state` pickles the
state, where a view would carry the whole batch). Masks, keypoints, a box format other than xyxy, a warning about too
many detections, and inputs of mixed dtype or device keep rfdetr's path.

Guarantees: the same tensors, dtypes and shapes in the metric's state as rfdetr's, bit for bit (element-wise
IEEE operations give the same result on a row whether it is converted alone or among others), and so the same
metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr_all

CALLBACK = "rfdetr.training.callbacks.coco_eval:COCOEvalCallback"
METRIC = "rfdetr.training.coco_map:OnePassCocoMeanAveragePrecision"


def per_image(converted: Any, counts: list[int]) -> list[Any]:
    """`converted`'s rows split into one tensor per image, each with storage of its own."""
    return [piece.clone() for piece in converted.split(counts)]


def uniform_boxes(items: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every item has (N, 4) boxes of one dtype on one device: what one concatenation can take."""
    boxes = [item["boxes"] for item in items]
    return bool(boxes) and all(
        box.ndim == 2 and box.shape[1] == 4 and box.dtype == boxes[0].dtype and box.device == boxes[0].device
        for box in boxes
    )


def targets_per_batch(original: Callable[..., list[dict[str, Any]]]) -> Callable[..., list[dict[str, Any]]]:
    """rfdetr's `_convert_targets` with one box conversion for the batch (see module doc)."""

    def convert_targets(
        callback: Any,
        targets: list[dict[str, Any]],
        preds: list[dict[str, Any]] | None = None,
        *,
        crowd_regions: Mapping[int, Sequence[Any]] | None = None,
    ) -> list[dict[str, Any]]:
        if any("masks" in target for target in targets) or not uniform_boxes(targets):
            return original(callback, targets, preds, crowd_regions=crowd_regions)
        import torch
        from rfdetr.utilities.box_ops import box_cxcywh_to_xyxy

        has_image_id = [("image_id" in target) for target in targets]
        add_crowd = bool(crowd_regions) and any(has_image_id)
        # rfdetr's one read of every image's size (and id), as it does it
        image_info = torch.stack([target["orig_size"] for target in targets])
        if add_crowd:
            image_ids = torch.stack(
                [
                    torch.as_tensor(target["image_id"], device=image_info.device).reshape(-1)[0]
                    if present
                    else torch.zeros((), device=image_info.device, dtype=image_info.dtype)
                    for target, present in zip(targets, has_image_id, strict=True)
                ]
            )
            image_info = torch.cat([image_info, image_ids.to(image_info.dtype).unsqueeze(1)], dim=1)
        image_rows = image_info.tolist()
        boxes = torch.cat([target["boxes"] for target in targets])
        counts = [len(target["boxes"]) for target in targets]
        scale = boxes.new_tensor([[w, h, w, h] for h, w, *_ in image_rows]).repeat_interleave(
            torch.tensor(counts, device=boxes.device), dim=0, output_size=len(boxes)
        )
        converted = per_image(box_cxcywh_to_xyxy(boxes) * scale, counts)
        out = []
        for index, target in enumerate(targets):
            regions: Sequence[Any] = ()
            if add_crowd and has_image_id[index]:
                assert crowd_regions is not None
                regions = crowd_regions.get(int(image_rows[index][2]), ())
            image_boxes, labels = converted[index], target["labels"]
            if regions:
                image_boxes = torch.cat([image_boxes, image_boxes.new_tensor([region.box for region in regions])])
                labels = torch.cat([labels, labels.new_tensor([region.label for region in regions])])
            entry = {"boxes": image_boxes, "labels": labels}
            if regions:
                iscrowd = target["iscrowd"] if "iscrowd" in target else torch.zeros_like(target["labels"])
                entry["iscrowd"] = torch.cat([iscrowd, iscrowd.new_ones(len(regions))])
            elif "iscrowd" in target:
                entry["iscrowd"] = target["iscrowd"]
            out.append(entry)
        return out

    return convert_targets


def update_per_batch(original: Callable[..., None]) -> Callable[..., None]:
    """rfdetr's metric `update` with one xyxy-to-xywh conversion for the batch's predictions and one for its
    targets (see module doc)."""

    def update(metric: Any, preds: list[dict[str, Any]], target: list[dict[str, Any]]) -> None:
        from rfdetr.training.coco_map import _METRIC_INPUT_FIELDS

        def fields(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                {name: value.detach().cpu() for name, value in item.items() if name in _METRIC_INPUT_FIELDS}
                for item in items
            ]

        limit = metric.max_detection_thresholds[-1]
        if (
            tuple(metric.iou_type) != ("bbox",)
            or metric.box_format != "xyxy"
            or not (preds and target)
            or (metric.warn_on_many_detections and any(len(item["boxes"]) > limit for item in preds))
        ):
            return original(metric, preds, target)
        cpu_preds, cpu_target = fields(preds), fields(target)
        if not (uniform_boxes(cpu_preds) and uniform_boxes(cpu_target)):
            return original(metric, preds, target)
        import torch
        from torchmetrics.detection.helpers import _input_validator
        from torchvision.ops import box_convert

        _input_validator(cpu_preds, cpu_target, iou_type=metric.iou_type)

        def xywh(items: list[dict[str, Any]]) -> list[Any]:
            boxes = torch.cat([item["boxes"] for item in items])
            return per_image(box_convert(boxes, in_fmt="xyxy", out_fmt="xywh"), [len(item["boxes"]) for item in items])

        # the rest as torchmetrics keeps it: the tensors handed in
        metric.detection_box.extend(xywh(cpu_preds))
        metric.detection_labels.extend(item["labels"] for item in cpu_preds)
        metric.detection_scores.extend(item["scores"] for item in cpu_preds)
        metric.groundtruth_box.extend(xywh(cpu_target))
        for item in cpu_target:
            metric.groundtruth_labels.append(item["labels"])
            metric.groundtruth_crowds.append(item.get("iscrowd", torch.zeros_like(item["labels"])))
            metric.groundtruth_area.append(item.get("area", torch.zeros_like(item["labels"])))

    return update


def metric_update_per_batch() -> AbstractContextManager[None]:
    """Within this block a validation batch's boxes reach rfdetr's COCO metric converted once per batch."""
    return patch_rfdetr_all((CALLBACK, "_convert_targets", targets_per_batch), (METRIC, "update", update_per_batch))

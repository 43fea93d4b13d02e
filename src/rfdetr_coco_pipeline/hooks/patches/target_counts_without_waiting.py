"""Send the batched loss's per-image target counts to the GPU without making the host wait.

On CUDA with a compiled model, rfdetr's loss evaluates every output layer's detection
losses in one set of kernels (`SetCriterion._get_batched_detection_losses`). For the cardinality error it builds
each image's number of targets on the GPU from a Python list (`torch.as_tensor(..., device=...)`): a copy from
pageable memory, which waits for everything queued on the GPU. In a training step that is the forward pass, so the
host stops there (`bench.profile_steps --sync-debug` names the line), and the loss's kernels are launched only after
the GPU has run dry.

This replaces the method with one that computes the same losses the same way, but sends those counts from pinned
memory without blocking (`send_without_waiting`). Batches with rfdetr's fixed-size target padding (a `valid` key),
whose counts are already on the GPU, go to rfdetr's own code. Guarantees: rfdetr's losses, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, send_without_waiting


def batched_losses_without_waiting(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `_get_batched_detection_losses`, with the target counts sent without waiting."""
    import torch
    from rfdetr.models.math import accuracy

    def _get_batched_detection_losses(
        self: Any,
        matched_outputs: list[dict[str, Any]],
        targets: list[dict[str, Any]],
        all_indices: list[list[tuple[Any, Any]]],
        matched_targets: list[Any],
        num_boxes: Any,
    ) -> list[dict[str, Any]]:
        if not targets or "valid" in targets[0]:
            return original(self, matched_outputs, targets, all_indices, matched_targets, num_boxes)
        logits = torch.stack([layer["pred_logits"] for layer in matched_outputs])
        boxes = torch.stack([layer["pred_boxes"] for layer in matched_outputs])
        target_labels = torch.stack([matched.labels for matched in matched_targets])
        per_layer = [
            torch.stack([matched.source_indices[0] for matched in matched_targets]),
            torch.stack([matched.source_indices[1] for matched in matched_targets]),
            target_labels,
            torch.stack([matched.boxes for matched in matched_targets]),
            torch.ones_like(target_labels, dtype=boxes.dtype),  # without a `valid` key every pair is real
        ]
        counts = send_without_waiting(torch.tensor([len(target["labels"]) for target in targets]), logits.device)
        loss_ce, loss_bbox, loss_giou, cardinality_error = self._resolve_batched_detection_losses(logits.device)(
            logits, boxes, *per_layer, counts, num_boxes, self.focal_alpha
        )
        layer_losses = []
        for layer, (outputs, matched) in enumerate(zip(matched_outputs, matched_targets, strict=True)):
            losses = {
                "loss_ce": loss_ce[layer],
                "loss_bbox": loss_bbox[layer],
                "loss_giou": loss_giou[layer],
                "cardinality_error": cardinality_error[layer],
            }
            if layer == 0:
                predicted = outputs["pred_logits"][matched.source_indices]
                losses["class_error"] = 100 - accuracy(predicted, matched.labels)[0]
            layer_losses.append(losses)
        return layer_losses

    return _get_batched_detection_losses


def target_counts_without_waiting() -> AbstractContextManager[None]:
    """Within this block rfdetr's batched loss sends its target counts without waiting (see module doc)."""
    return patch_rfdetr(
        "rfdetr.models.criterion:SetCriterion", "_get_batched_detection_losses", batched_losses_without_waiting
    )

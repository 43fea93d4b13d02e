"""Bring a validation batch's predictions and targets to the host in one copy per dtype, not one per tensor.

rfdetr's `COCOEvalCallback` converts each batch's post-processed predictions and targets
(`_convert_preds`, `_convert_targets`) and leaves them on the GPU. Its COCO metric then copies every image's boxes,
scores and labels to the host one tensor at a time (`OnePassCocoMeanAveragePrecision.update`), and the F1 matching
reads them back again (`build_matching_data`: labels, scores and each image's IoU matrix). At batch 125 that is
about 1,500 small copies a batch, each one a wait for the GPU.

This wraps `_convert_preds` and `_convert_targets`, the two places where a batch's tensors enter the metric. Every
tensor of one dtype is flattened into one buffer, copied to the host once, and handed on as views of that copy with
their own shapes: the predictions after rfdetr's `_convert_preds` (post-processed on the GPU), the targets before
rfdetr's `_convert_targets`, so that its per-image conversion (a host-to-device copy of the image's size and a few
element-wise operations per image, about a thousand small GPU launches a batch of 125) runs on host tensors.
Everything after works on host tensors, as rfdetr's metric does with its own copies. Segmentation (masks) keeps
rfdetr's path. rfdetr's metric keeps the views it is handed, and its DDP merge (`merge_distributed_state`) pickles
the state for the other ranks, where a view would carry its whole buffer, the batch's, once per image: within this
block each kept view is copied to storage of its own first, on a rank of a DDP run only.

Guarantees: the same keys, values, dtypes and shapes as rfdetr's tensors, on the CPU; the metrics computed from
them equal rfdetr's, also after two DDP ranks merge their states (the targets' conversion and the F1 matching's box
IoU then run on the host: the same IEEE element-wise operations, checked equal on the GPU).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr_all

CALLBACK = "rfdetr.training.callbacks.coco_eval:COCOEvalCallback"
METRIC = "rfdetr.training.coco_map:OnePassCocoMeanAveragePrecision"


def to_host_in_one_copy(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` (dicts of tensors) with every tensor on the CPU: one copy per (device, dtype), views of it after."""
    import torch

    groups: dict[tuple[Any, Any], list[tuple[int, str, Any]]] = defaultdict(list)
    for index, item in enumerate(items):
        for key, value in item.items():
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                groups[(value.device, value.dtype)].append((index, key, value))
    moved = [dict(item) for item in items]
    for entries in groups.values():
        flat = torch.cat([value.detach().reshape(-1) for _, _, value in entries]).cpu()
        pieces = flat.split([value.numel() for _, _, value in entries])
        for (index, key, value), piece in zip(entries, pieces, strict=True):
            moved[index][key] = piece.view(value.shape)
    return moved


def own_storage(tensor: Any) -> Any:
    """`tensor`, or a copy of it when it is a view into a larger buffer (a copy pickles only its own values)."""
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        return tensor.clone()
    return tensor


def merged_from_own_storage(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """rfdetr's `merge_distributed_state`, after every state tensor kept as a view is given storage of its own."""

    def merge_distributed_state(metric: Any) -> None:
        import torch
        from rfdetr.training.coco_map import _MAP_STATE_ATTRS
        from rfdetr.utilities.distributed import get_world_size, is_dist_avail_and_initialized

        if is_dist_avail_and_initialized() and get_world_size() > 1:
            for name in _MAP_STATE_ATTRS:  # masks are kept as RLE tuples, not tensors
                kept = getattr(metric, name)
                setattr(metric, name, [own_storage(v) if isinstance(v, torch.Tensor) else v for v in kept])
        return original(metric)

    return merge_distributed_state


def has_masks(items: list[dict[str, Any]]) -> bool:
    return any("masks" in item for item in items)


def preds_on_host(original: Callable[..., list[dict[str, Any]]]) -> Callable[..., list[dict[str, Any]]]:
    def convert_preds(callback: Any, preds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        converted = original(callback, preds)
        return converted if has_masks(converted) else to_host_in_one_copy(converted)

    return convert_preds


def targets_on_host(original: Callable[..., list[dict[str, Any]]]) -> Callable[..., list[dict[str, Any]]]:
    def convert_targets(callback: Any, targets: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        if has_masks(targets):
            return original(callback, targets, *args, **kwargs)
        return original(callback, to_host_in_one_copy(targets), *args, **kwargs)

    return convert_targets


def metric_inputs_in_one_copy() -> AbstractContextManager[None]:
    """Within this block, rfdetr's COCO metric callback gets its inputs on the host in one copy per dtype."""
    return patch_rfdetr_all(
        (CALLBACK, "_convert_preds", preds_on_host),
        (CALLBACK, "_convert_targets", targets_on_host),
        (METRIC, "merge_distributed_state", merged_from_own_storage),
    )

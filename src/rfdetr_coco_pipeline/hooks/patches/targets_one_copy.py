"""Move a training batch's targets to the GPU in one copy per field instead of one per field per image.

Replaces `rfdetr.utilities.tensors.PackedTargets.to_list`, which `transfer_batch_to_device` calls
with the batch's packed targets (one tensor per field for the whole batch) and which copies every image's slice of
every field to the GPU on its own: about 770 host-to-device copies per step at batch 128 with six fields, each
launched by the host while the GPU waits for the step's forward pass.

Here each field is copied once and each image gets a view of its part. Guarantees: values, dtypes, shapes and
devices are those of rfdetr's copies; the images' tensors are disjoint slices of a fresh copy, also when the packed
targets are on the device already, so an in-place write to one image's tensor changes neither another's nor the
packed source (what rfdetr's separate copies guarantee); a CPU destination keeps rfdetr's code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def split_after_one_copy(packed: Any, device: Any, non_blocking: bool = False) -> list[dict[str, Any]]:
    """What `PackedTargets.to_list` returns (one dict of tensors per image, on `device`), from one copy per field:
    each image's tensors are views of disjoint parts of that copy."""
    targets: list[dict[str, Any]] = [{} for _ in range(len(packed))]
    for key, flat in packed.fields.items():
        shapes = packed._shapes[key]  # per image; plain ints, no tensor
        # copy=True: packed targets already on the device (validation_batches_on_device) still give fresh tensors
        copied = flat.to(device, non_blocking=non_blocking, copy=True)
        pieces = copied.split([math.prod(shape) for shape in shapes])
        for target, piece, shape in zip(targets, pieces, shapes, strict=True):
            target[key] = piece.view(shape)
    return targets


def to_list_in_one_copy_per_field(original: Callable[..., list[dict[str, Any]]]) -> Callable[..., Any]:
    """`PackedTargets.to_list` with one copy per field to a GPU; `original` serves other destinations."""
    import torch

    def to_list(packed: Any, device: Any, non_blocking: bool = False) -> list[dict[str, Any]]:
        if torch.device(device).type != "cuda":
            return original(packed, device, non_blocking)
        return split_after_one_copy(packed, device, non_blocking)

    return to_list


def targets_one_copy() -> AbstractContextManager[None]:
    """Within this block, packed training targets reach the GPU in one copy per field (see module doc)."""
    return patch_rfdetr("rfdetr.utilities.tensors:PackedTargets", "to_list", to_list_in_one_copy_per_field)

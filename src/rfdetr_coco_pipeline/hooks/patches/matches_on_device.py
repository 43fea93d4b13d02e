"""Give rfdetr's loss its matched indices on the GPU, in one copy per training step.

rfdetr solves all of a step's Hungarian matching problems on the GPU in one batch, brings the assignment to
the host, and hands the loss one (query indices, target indices) pair of CPU tensors per image and decoder layer.
The loss then indexes CUDA tensors with them; each such index is first copied to the GPU from pageable memory, and
that copy waits until the GPU has finished everything queued before it (about 770 such waits per step at batch 128).

This wraps `rfdetr.models._assignment.assign_many_bucketed`, the one function every GPU matching passes through
(the matcher looks it up on that module at each call): all of a step's indices are copied to the GPU at once, from
pinned memory, without waiting. Guarantees: the same index values, only on the cost matrices' device; matching and
losses are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, send_without_waiting

Matches = list[list[tuple[Any, Any]]]  # per layer, per image: (query indices, target indices)


def move_matches(matches: Matches, device: Any) -> Matches:
    """The same index pairs on `device`: one concatenation on the host, one copy (from pinned memory when the
    target is a GPU, so the host does not wait for it), then views of that one tensor."""
    import torch

    flat = [indices for layer in matches for pair in layer for indices in pair]
    if not flat:
        return matches
    pieces = iter(send_without_waiting(torch.cat(flat), device).split([indices.numel() for indices in flat]))
    return [[(next(pieces), next(pieces)) for _ in layer] for layer in matches]


def on_device_of_costs(assign: Callable[..., Matches]) -> Callable[..., Matches]:
    """Wrap rfdetr's solver so its answer lives where the cost matrices were (it returns host tensors)."""

    def assign_on_device(cost_matrices: list[Any], *args: Any) -> Matches:
        matches = assign(cost_matrices, *args)
        device = cost_matrices[0].device
        return move_matches(matches, device) if device.type == "cuda" else matches

    return assign_on_device


def matches_on_device() -> AbstractContextManager[None]:
    """Within this block, rfdetr's batched matcher hands its indices to the loss on the GPU (see module doc)."""
    return patch_rfdetr("rfdetr.models._assignment", "assign_many_bucketed", on_device_of_costs)

"""Give rfdetr's loss its matched indices on the GPU, in one copy per training step.

rfdetr 1.11.2 solves all of a step's Hungarian matching problems on the GPU in one batch, brings the assignment to
the host, and hands the loss one (query indices, target indices) pair of CPU tensors per image and decoder layer.
The loss then indexes CUDA tensors with them (`target["labels"][target_indices]`, ...). Each such index is first
copied to the GPU from pageable memory, and that copy waits until the GPU has finished everything queued before
it. Profiled on an H200 at batch 128 (BENCHMARKS.md, `bench.profile_steps`): about 770 such waits per step. Each
one is short (together about 6 ms of host time per step in the compiled recipe), and removing them gave 1.03x.

`matches_on_device()` copies all of a step's indices to the GPU at once, from pinned memory, without waiting, and
hands the loss the same values as CUDA tensors. Only where the index tensors live changes: the matching, the losses
and therefore the training are the same. It wraps the one function of a private rfdetr module through which every
GPU matching passes (`rfdetr.models._assignment.assign_many_bucketed`, which the matcher looks up on that module at
each call), so it refuses any rfdetr version but the one it was checked against (`SUPPORTED_RFDETR`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from scripts.common import patch_rfdetr, send_without_waiting

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
    return patch_rfdetr(
        "rfdetr.models._assignment", "assign_many_bucketed", on_device_of_costs, "scripts/matches_on_device.py"
    )

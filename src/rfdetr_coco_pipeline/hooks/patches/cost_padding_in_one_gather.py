"""The matcher's batch of padded cost matrices in three GPU operations instead of one copy per layer and image.

rfdetr's batched matching (`_assignment._stack_padded`) folds every (layer, image, group) problem into one batch:
it fills a zero tensor with each image's block of each layer's cost matrix, one indexed copy per layer and image.
At batch 128 with three matched layers that is 384 small copies a step, each launched by the host.

This replaces the function with one that stacks the layers' matrices (one copy), reads every problem's costs with
one indexed read (the columns of each image's targets, built on the host from the target counts, known there, and
sent to the GPU without waiting) and zeroes the padded columns (one `where`). A batch without any target (which
rfdetr's matcher does not pad) goes to rfdetr's function. Guarantees: `_stack_padded`'s tensor, element for
element.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, send_without_waiting


def padded_in_one_gather(
    cost_matrices: list[Tensor], sizes: list[int], group_width: int, group_detr: int, max_size: int
) -> Tensor:
    """rfdetr's `_stack_padded`: `[layers * images * groups, group_width, max_size]`, ordered layer, image, group,
    each image's target columns first and zeros after them; for at least one target in the batch."""
    layers, images, device = len(cost_matrices), len(sizes), cost_matrices[0].device
    costs = torch.stack(cost_matrices).view(layers, group_detr, group_width, -1)
    sizes_on_host = torch.tensor(sizes)
    starts = torch.cumsum(sizes_on_host, 0) - sizes_on_host
    padded_column = torch.arange(max_size)
    present = padded_column < sizes_on_host[:, None]  # (images, max_size)
    # a padded column reads the batch's first column (any real one would do): the `where` below zeroes it
    columns = torch.where(present, starts[:, None] + padded_column, 0)
    columns = send_without_waiting(columns, device).view(1, images, 1, 1, max_size)
    present = send_without_waiting(present, device).view(1, images, 1, 1, max_size)
    layer = torch.arange(layers, device=device).view(layers, 1, 1, 1, 1)
    group = torch.arange(group_detr, device=device).view(1, 1, group_detr, 1, 1)
    query = torch.arange(group_width, device=device).view(1, 1, 1, group_width, 1)
    gathered = costs[layer, group, query, columns]  # (layers, images, groups, group_width, max_size)
    return torch.where(present, gathered, 0).reshape(-1, group_width, max_size)


def pad_in_one_gather(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def _stack_padded(
        cost_matrices: list[Tensor], sizes: list[int], group_width: int, group_detr: int, max_size: int
    ) -> Tensor:
        if max_size > 0:
            return padded_in_one_gather(cost_matrices, sizes, group_width, group_detr, max_size)
        return original(cost_matrices, sizes, group_width, group_detr, max_size)

    return _stack_padded


def cost_padding_in_one_gather() -> AbstractContextManager[None]:
    """Within this block the matcher pads its cost matrices in three operations (see the module's text)."""
    return patch_rfdetr("rfdetr.models._assignment", "_stack_padded", pad_in_one_gather)

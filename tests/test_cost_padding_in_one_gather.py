"""The cost_padding_in_one_gather speedup: the matcher's padded cost batch is rfdetr's, element for element, and the
matcher's assignment does not change."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches.cost_padding_in_one_gather import (
    cost_padding_in_one_gather,
    padded_in_one_gather,
)
from tests.helpers.rfdetr_steps import counted_calls, decoder_step, index_pairs, solve_all_layers


@pytest.mark.parametrize(
    ("sizes", "layers"),
    [
        ([3, 0, 1, 5], 3),  # an image without objects among them
        ([2, 7, 7], 1),  # the longest twice
        ([0, 4], 2),  # the first image empty
    ],
)
def test_the_padded_batch_is_rfdetrs_element_for_element(sizes, layers):
    from rfdetr.models._assignment import _stack_padded

    group_detr, group_width = 3, 5
    generator = torch.Generator().manual_seed(sum(sizes) + layers)
    costs = [torch.randn(group_detr * group_width, sum(sizes), generator=generator) for _ in range(layers)]
    expected = _stack_padded(costs, sizes, group_width, group_detr, max(sizes))
    ours = padded_in_one_gather(costs, sizes, group_width, group_detr, max(sizes))
    assert ours.shape == expected.shape == (layers * len(sizes) * group_detr, group_width, max(sizes))
    assert ours.dtype == expected.dtype and torch.equal(ours, expected)


def test_the_matchers_assignment_is_unchanged(tmp_path, monkeypatch):
    """With the batch padded through the extension, rfdetr's padded assignment gives its own index pairs, and a
    training step's matching with matching_without_waiting (the path that pads on the CPU too) gives that path's."""
    from rfdetr.models import _assignment

    from rfdetr_coco_pipeline.hooks.patches import cost_padding_in_one_gather as extension
    from rfdetr_coco_pipeline.hooks.patches.matching_without_waiting import matching_without_waiting

    sizes, group_detr, group_width = [3, 0, 1, 5], 3, 6
    costs = [
        torch.rand(group_detr * group_width, sum(sizes), generator=torch.Generator().manual_seed(i)) for i in (0, 1)
    ]
    criterion, outputs, targets = decoder_step("cpu", 5, tmp_path)
    original = _assignment._stack_padded
    plain_assignment = _assignment._assign_padded(costs, sizes, group_width, group_detr)
    calls = counted_calls(monkeypatch, extension, "padded_in_one_gather")
    with cost_padding_in_one_gather(), matching_without_waiting():
        padded_here = _assignment._stack_padded is not original
        assignment = _assignment._assign_padded(costs, sizes, group_width, group_detr)
        ours = solve_all_layers(criterion, outputs, targets)
    with matching_without_waiting():
        plain = solve_all_layers(criterion, outputs, targets)
    assert padded_here and _assignment._stack_padded is original
    assert calls == [1, 1], "the assignment and the matcher did not pad through the extension"
    assert index_pairs(assignment) == index_pairs(plain_assignment)
    assert index_pairs(ours) == index_pairs(plain)


@pytest.mark.gpu
def test_on_the_gpu_the_padded_batch_is_rfdetrs_and_nothing_waits():
    from rfdetr.models._assignment import _stack_padded

    sizes = [3, 0, 1, 5]
    costs = [torch.randn(13 * 300, sum(sizes), device="cuda") for _ in range(3)]
    expected = _stack_padded(costs, sizes, 300, 13, max(sizes))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours = padded_in_one_gather(costs, sizes, 300, 13, max(sizes))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(ours, expected)

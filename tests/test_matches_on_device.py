"""The matches_on_device speedup: rfdetr's matched indices reach the loss on the GPU, with the same values."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches import matches_on_device as extension
from tests.helpers.rfdetr_steps import solve_all_layers, tiny_detector_step


def test_moved_matches_keep_their_values_and_nesting():
    matches = [
        [(torch.tensor([4, 9]), torch.tensor([1, 0])), (torch.zeros(0, dtype=torch.int64),) * 2],
        [(torch.tensor([7]), torch.tensor([0])), (torch.tensor([2, 3, 5]), torch.tensor([2, 0, 1]))],
    ]
    moved = extension.move_matches(matches, "cpu")
    assert [[tuple(t.tolist() for t in pair) for pair in layer] for layer in moved] == [
        [tuple(t.tolist() for t in pair) for pair in layer] for layer in matches
    ]
    assert extension.move_matches([], "cpu") == []


def test_the_loss_is_the_same_with_and_without_the_extension_on_the_cpu(tmp_path):
    criterion, outputs, targets = tiny_detector_step("cpu", 4, tmp_path)
    from rfdetr.models import _assignment

    original = _assignment.assign_many_bucketed
    plain = criterion(outputs, targets)
    with extension.matches_on_device():
        assert _assignment.assign_many_bucketed is not original
        wrapped = criterion(outputs, targets)
    assert _assignment.assign_many_bucketed is original  # restored when the block ends
    assert plain.keys() == wrapped.keys() and all(torch.equal(plain[k], wrapped[k]) for k in plain)


@pytest.mark.gpu
def test_on_the_gpu_the_loss_gets_the_same_indices_on_the_gpu_and_the_same_losses(tmp_path):
    criterion, outputs, targets = tiny_detector_step("cuda", 32, tmp_path)
    plain_matches = solve_all_layers(criterion, outputs, targets)
    plain_losses = criterion(outputs, targets)
    with extension.matches_on_device():
        matches = solve_all_layers(criterion, outputs, targets)
        losses = criterion(outputs, targets)
    assert plain_matches is not None, "rfdetr's batched GPU matcher declined these inputs"
    assert all(not indices.is_cuda for layer in plain_matches for pair in layer for indices in pair)
    assert all(indices.is_cuda for layer in matches for pair in layer for indices in pair)
    assert [[[i.tolist() for i in pair] for pair in layer] for layer in matches] == [
        [[i.tolist() for i in pair] for pair in layer] for layer in plain_matches
    ]
    assert plain_losses.keys() == losses.keys() and all(torch.equal(plain_losses[k], losses[k]) for k in losses)

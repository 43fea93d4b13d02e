"""The gather_matched_targets speedup: the loss's matched targets, gathered per layer at once, equal rfdetr's."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches import gather_matched_targets as extension
from tests.helpers.rfdetr_steps import solve_all_layers, tiny_detector_step


def assert_same_matched_targets(ours, rfdetr_s):
    pairs = [
        (ours.source_indices[0], rfdetr_s.source_indices[0]),
        (ours.source_indices[1], rfdetr_s.source_indices[1]),
        (ours.labels, rfdetr_s.labels),
        (ours.boxes, rfdetr_s.boxes),
    ]
    for mine, theirs in pairs:
        assert mine.dtype == theirs.dtype and mine.device == theirs.device and torch.equal(mine, theirs)


def test_each_layers_matched_targets_equal_rfdetrs(tmp_path):
    criterion, outputs, targets = tiny_detector_step("cpu", 6, tmp_path)
    from rfdetr.models.criterion import SetCriterion

    original = SetCriterion._get_matched_targets
    layers = solve_all_layers(criterion, outputs, targets)
    assert layers is not None and len(layers) > 1
    batched = extension.batched_get_matched_targets(original)
    for indices in layers:
        assert_same_matched_targets(batched(criterion, targets, indices), original(criterion, targets, indices))


def test_images_without_matches_and_the_next_steps_targets_are_handled():
    from rfdetr.models.criterion import SetCriterion

    original = SetCriterion._get_matched_targets
    batched = extension.batched_get_matched_targets(original)
    criterion = SetCriterion.__new__(SetCriterion)  # the gathering reads no state of the loss
    for step in range(2):  # a new batch must not reuse the previous batch's concatenated targets
        sizes = [2, 0, 3] if step == 0 else [1, 4, 0]
        targets = [{"labels": torch.randint(0, 80, (n,)), "boxes": torch.rand(n, 4)} for n in sizes]
        indices = [(torch.randperm(300)[:n], torch.randperm(n)) for n in sizes]
        assert_same_matched_targets(batched(criterion, targets, indices), original(criterion, targets, indices))


def test_the_loss_is_the_same_with_and_without_the_extension(tmp_path):
    criterion, outputs, targets = tiny_detector_step("cpu", 4, tmp_path)
    from rfdetr.models.criterion import SetCriterion

    original = SetCriterion._get_matched_targets
    plain = criterion(outputs, targets)
    with extension.gather_matched_targets():
        assert SetCriterion._get_matched_targets is not original
        gathered = criterion(outputs, targets)
    assert SetCriterion._get_matched_targets is original
    assert plain.keys() == gathered.keys() and all(torch.equal(plain[k], gathered[k]) for k in plain)


@pytest.mark.gpu
def test_on_the_gpu_the_matched_targets_and_losses_equal_rfdetrs(tmp_path):
    from rfdetr_coco_pipeline.hooks.patches.matches_on_device import matches_on_device

    criterion, outputs, targets = tiny_detector_step("cuda", 32, tmp_path)
    from rfdetr.models.criterion import SetCriterion

    original = SetCriterion._get_matched_targets
    batched = extension.batched_get_matched_targets(original)
    with matches_on_device():
        layers = solve_all_layers(criterion, outputs, targets)
        plain = criterion(outputs, targets)
        with extension.gather_matched_targets():
            gathered = criterion(outputs, targets)
    for indices in layers:
        assert_same_matched_targets(batched(criterion, targets, indices), original(criterion, targets, indices))
    assert plain.keys() == gathered.keys() and all(torch.equal(plain[k], gathered[k]) for k in plain)

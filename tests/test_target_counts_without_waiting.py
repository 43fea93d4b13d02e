"""The target_counts_without_waiting speedup: rfdetr's batched detection losses, bit for bit, without a copy that
waits for the GPU."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches.target_counts_without_waiting import (
    batched_losses_without_waiting,
    target_counts_without_waiting,
)
from tests.helpers.rfdetr_steps import decoder_step, solve_all_layers


def batched_loss_inputs(device: str, tmp_path):
    """What rfdetr's loss hands `_get_batched_detection_losses` in a training step: every output layer, the targets,
    each layer's matches and matched targets, and the box count."""
    criterion, outputs, targets = decoder_step(device, 6, tmp_path)
    layers = [{k: v for k, v in outputs.items() if k not in ("aux_outputs", "enc_outputs")}, *outputs["aux_outputs"]]
    layers += [outputs["enc_outputs"]] if "enc_outputs" in outputs else []
    all_indices = solve_all_layers(criterion, outputs, targets)
    assert all_indices is not None and len(all_indices) == len(layers) > 1
    matched = [criterion._get_matched_targets(targets, indices) for indices in all_indices]
    return criterion, (layers, targets, all_indices, matched, criterion.num_boxes_for_targets(outputs, targets))


def assert_same_losses(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for mine, their in zip(ours, theirs, strict=True):
        assert mine.keys() == their.keys()
        assert all(mine[k].dtype == their[k].dtype and torch.equal(mine[k], their[k]) for k in mine)


def test_the_batched_losses_are_rfdetrs(tmp_path):
    from rfdetr.models.criterion import SetCriterion

    criterion, inputs = batched_loss_inputs("cpu", tmp_path)
    original = SetCriterion._get_batched_detection_losses
    assert_same_losses(batched_losses_without_waiting(original)(criterion, *inputs), original(criterion, *inputs))


def test_padded_targets_go_to_rfdetrs_code(tmp_path):
    from rfdetr.models.criterion import SetCriterion

    criterion, (layers, targets, all_indices, matched, num_boxes) = batched_loss_inputs("cpu", tmp_path)
    padded = [{**target, "valid": torch.ones(len(target["labels"]), dtype=torch.bool)} for target in targets]
    calls = []

    def rfdetrs(*args):
        calls.append(args)
        return SetCriterion._get_batched_detection_losses(*args)

    ours = batched_losses_without_waiting(rfdetrs)(criterion, layers, padded, all_indices, matched, num_boxes)
    assert len(calls) == 1 and calls[0][2] is padded
    assert_same_losses(ours, SetCriterion._get_batched_detection_losses(criterion, layers, padded, *calls[0][3:]))


def test_the_method_is_replaced_inside_the_block_only():
    from rfdetr.models.criterion import SetCriterion

    original = SetCriterion._get_batched_detection_losses
    with target_counts_without_waiting():
        assert SetCriterion._get_batched_detection_losses is not original
    assert SetCriterion._get_batched_detection_losses is original


@pytest.mark.gpu
def test_on_the_gpu_the_losses_are_rfdetrs_and_nothing_waits(tmp_path):
    if not torch.cuda.is_available():
        pytest.fail("this GPU test needs CUDA: run it on the GPU machine (pytest -m gpu)")
    from rfdetr.models.criterion import SetCriterion

    from rfdetr_coco_pipeline.hooks.patches.matches_on_device import matches_on_device

    with matches_on_device():  # in training the matches reach the loss on the GPU (a speedup `auto` applies there)
        criterion, inputs = batched_loss_inputs("cuda", tmp_path)
    assert all(index.is_cuda for layer in inputs[2] for pair in layer for index in pair)
    criterion.enable_compiled_detection_losses()  # as rfdetr's training module does when the model is compiled
    original = SetCriterion._get_batched_detection_losses
    assert criterion._can_batch_detection_losses(inputs[0], inputs[3])  # the path rfdetr takes there
    theirs = original(criterion, *inputs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            original(criterion, *inputs)  # rfdetr's copy of the counts waits
        ours = batched_losses_without_waiting(original)(criterion, *inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same_losses(ours, theirs)

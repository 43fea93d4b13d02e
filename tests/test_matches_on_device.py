"""scripts/matches_on_device.py: rfdetr's matched indices reach the loss on the GPU, with the same values."""

from __future__ import annotations

import pytest
import torch

from scripts import matches_on_device as extension


def tiny_detector_step(device: str, batch: int, tmp_path, resolution: int = 128) -> tuple[object, dict, list[dict]]:
    """rfdetr's own Nano detector and loss, one training-mode forward on random images and boxes."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_model import RFDETRModelModule
    from rfdetr.utilities.tensors import NestedTensor

    torch.manual_seed(0)
    module = RFDETRModelModule(
        RFDETRNanoConfig(pretrain_weights=None, resolution=resolution, device=device),
        TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path)),
    )
    model = module.model.to(device).train()
    pixels = torch.rand(batch, 3, resolution, resolution, device=device)
    images = NestedTensor(pixels, torch.zeros(batch, resolution, resolution, dtype=torch.bool, device=device))
    targets = [
        {"labels": torch.randint(0, 80, (n,), device=device), "boxes": torch.rand(n, 4, device=device) * 0.4 + 0.3}
        for n in [1 + i % 6 for i in range(batch)]
    ]
    with torch.no_grad():
        outputs = model(images, targets)
    return module.criterion, outputs, targets


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


def solve_all_layers(criterion, outputs, targets):
    """rfdetr's batched matching of every decoder layer at once, as its loss calls it in a training step."""
    layers = [{k: v for k, v in outputs.items() if k not in ("aux_outputs", "enc_outputs")}]
    layers += outputs["aux_outputs"] + ([outputs["enc_outputs"]] if "enc_outputs" in outputs else [])
    matcher = criterion.matcher
    return type(matcher)._match_many(matcher, layers, targets, group_detr=criterion.group_detr)


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

"""backbone_maps_in_one_buffer: in a real Nano training step the backbone's feature maps hold rfdetr's values bit for
bit as channel slices of one channels-last buffer, and the step gives rfdetr's loss and gradients; evaluation is
rfdetr's."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks import applied, select_speedups
from tests.helpers.rfdetr_steps import (
    assert_gradients_alike,
    assert_no_further_from_exact,
    nano_and_batch,
    nano_training_step,
)

SPEEDUP = ["backbone_maps_in_one_buffer"]


def backbone_of(module):
    """rfdetr's WindowedDinov2WithRegistersBackbone inside the Nano module."""
    return module.model.backbone[0].encoder.encoder


def training_step(tmp_path, speedups: list[str], autocast: bool = False, device: str = "cpu"):
    """One training step of rfdetr's Nano with `speedups` in place: the loss, every parameter's gradient, and the
    feature maps the backbone returned."""
    module, images, targets = nano_and_batch(tmp_path, device)
    maps = []
    backbone_of(module).register_forward_hook(lambda m, args, out: maps.extend(out[0]))
    _, loss, grads = nano_training_step(module, images, targets, speedups, autocast, device)
    return loss, grads, [feature_map.detach() for feature_map in maps]


def test_the_maps_are_rfdetrs_bit_for_bit_as_slices_of_one_channels_last_buffer(tmp_path):
    from rfdetr.models.backbone.dinov2_with_windowed_attn import WindowedDinov2WithRegistersBackbone

    original = WindowedDinov2WithRegistersBackbone.forward
    expected_loss, expected_grads, expected_maps = training_step(tmp_path / "rfdetr", [])
    loss, grads, maps = training_step(tmp_path / "lean", SPEEDUP)
    assert WindowedDinov2WithRegistersBackbone.forward is original  # rfdetr's method is back after the block
    assert len(maps) == len(expected_maps) == 4
    width = 384
    for feature_map, expected in zip(maps, expected_maps, strict=True):
        assert feature_map.shape == expected.shape == (2, width, 4, 4)  # 4 x 4 patches of 16 px at 64 px
        assert torch.equal(feature_map, expected)
        assert expected.is_contiguous() and not feature_map.is_contiguous()  # rfdetr copies each map on its own
        # a channel slice of a (batch, rows, columns, 4 x width) buffer: channels-last, 4 maps wide
        assert feature_map.stride() == (4 * 4 * 4 * width, 1, 4 * 4 * width, 4 * width)
    assert len({feature_map.untyped_storage().data_ptr() for feature_map in maps}) == 1
    assert [feature_map.storage_offset() for feature_map in maps] == [0, width, 2 * width, 3 * width]
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    # the projector's convolution runs on channels-last input: float32 rounding in another order
    assert_gradients_alike(grads, expected_grads, most_apart=2e-4)


def test_evaluation_is_rfdetrs_own(tmp_path):
    module, images, _ = nano_and_batch(tmp_path)
    backbone = backbone_of(module).eval()
    with torch.no_grad():
        expected = backbone(images.tensors)[0]
        with applied(select_speedups(SPEEDUP, "1.11.2", device_kind="cpu")):
            maps = backbone(images.tensors)[0]
    assert len(maps) == 4
    for feature_map, expected_map in zip(maps, expected, strict=True):
        assert feature_map.is_contiguous() and torch.equal(feature_map, expected_map)


@pytest.mark.gpu
def test_on_the_gpu_the_step_gives_rfdetrs(tmp_path):
    _, exact_grads, _ = training_step(tmp_path / "float32", [], device="cuda")
    expected_loss, expected_grads, expected_maps = training_step(tmp_path / "rfdetr", [], autocast=True, device="cuda")
    loss, grads, maps = training_step(tmp_path / "lean", SPEEDUP, autocast=True, device="cuda")
    assert all(torch.equal(a, b) for a, b in zip(maps, expected_maps, strict=True))
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert_no_further_from_exact(grads, expected_grads, exact_grads)

"""patch_embedding_as_product: a real Nano training step embeds the patches without the convolution and gives
rfdetr's loss and gradients; the rows are the convolution's patches; evaluation and other convolutions are rfdetr's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rfdetr_coco_pipeline.hooks import applied, select_speedups
from rfdetr_coco_pipeline.hooks.patches.patch_embedding_as_product import patches_as_rows
from tests.helpers.rfdetr_steps import (
    BF16_ON_CPU,
    assert_gradients_alike,
    assert_no_further_from_exact,
    nano_and_batch,
    nano_training_step,
)

SPEEDUP = ["patch_embedding_as_product"]


def training_step(tmp_path, speedups: list[str], autocast: bool = False, device: str = "cpu", **model: object):
    """One training step of rfdetr's Nano with `speedups` in place (`model`: further RFDETRNanoConfig settings): the
    loss, every parameter's gradient, the patch embeddings, and how many times the embedding's convolution ran."""
    module, images, targets = nano_and_batch(tmp_path, device, **model)
    patch_embeddings = module.model.backbone[0].encoder.encoder.embeddings.patch_embeddings
    embedded, convolutions = [], []
    patch_embeddings.register_forward_hook(lambda m, args, out: embedded.append(out.detach().float()))
    patch_embeddings.projection.register_forward_hook(lambda *_: convolutions.append(1))
    _, loss, grads = nano_training_step(module, images, targets, speedups, autocast, device)
    return loss, grads, embedded[0], len(convolutions)


@pytest.fixture(scope="module")
def rfdetrs_step(tmp_path_factory):
    return training_step(tmp_path_factory.mktemp("rfdetr"), [])


def test_the_step_embeds_without_the_convolution_and_gives_rfdetrs_loss_and_gradients(tmp_path, rfdetrs_step):
    from rfdetr.models.backbone.dinov2_with_windowed_attn import Dinov2WithRegistersPatchEmbeddings

    original = Dinov2WithRegistersPatchEmbeddings.forward
    expected_loss, expected_grads, expected_embedded, rfdetr_convolutions = rfdetrs_step
    loss, grads, embedded, convolutions = training_step(tmp_path, SPEEDUP)
    assert Dinov2WithRegistersPatchEmbeddings.forward is original  # rfdetr's method is back after the block
    assert (rfdetr_convolutions, convolutions) == (1, 0)
    assert embedded.shape == expected_embedded.shape == (2, 16, 384)  # 4 x 4 patches of 16 px at 64 px
    assert torch.allclose(embedded, expected_embedded, rtol=1e-5, atol=1e-5)
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    kernel = "backbone.0.encoder.encoder.embeddings.patch_embeddings.projection.weight"
    assert kernel in grads and grads[kernel].shape == (384, 3, 16, 16)
    # the embeddings' float32 rounding, carried through the network
    assert_gradients_alike(grads, expected_grads, most_apart=2e-4)


def test_the_rows_are_the_convolutions_patches_in_its_order():
    pixels = torch.randn(2, 3, 32, 48)
    rows = patches_as_rows(pixels, (16, 16))
    # torch's unfold: each column one window of the convolution, its values in the kernel's (channel, y, x) order
    assert torch.equal(rows, F.unfold(pixels, kernel_size=16, stride=16).transpose(1, 2))
    kernel, bias = torch.randn(5, 3, 16, 16), torch.randn(5)
    expected = F.conv2d(pixels, kernel, bias, stride=16).flatten(2).transpose(1, 2)
    assert torch.allclose(F.linear(rows, kernel.reshape(5, -1), bias), expected, rtol=1e-5, atol=1e-4)


def test_under_bf16_autocast_the_step_gives_rfdetrs_within_bf16_rounding(tmp_path):
    expected_loss, expected_grads, expected_embedded, _ = training_step(
        tmp_path / "rfdetr", [], autocast=True, **BF16_ON_CPU
    )
    loss, grads, embedded, _ = training_step(tmp_path / "lean", SPEEDUP, autocast=True, **BF16_ON_CPU)
    assert torch.allclose(embedded, expected_embedded, rtol=2e-2, atol=2e-2)
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert_gradients_alike(grads, expected_grads, least_cosine=0.999)


def test_evaluation_and_other_convolutions_are_rfdetrs(tmp_path):
    from rfdetr.models.backbone.dinov2_with_windowed_attn import Dinov2WithRegistersPatchEmbeddings

    module, images, _ = nano_and_batch(tmp_path)
    patch_embeddings = module.model.backbone[0].encoder.encoder.embeddings.patch_embeddings
    pixels = images.tensors
    with applied(select_speedups(SPEEDUP, "1.11.2", device_kind="cpu")), torch.no_grad():
        evaluated = patch_embeddings.eval()(pixels)
        # a convolution whose windows overlap is not a product over patches: rfdetr's forward runs it
        patch_embeddings.train().projection.padding = (8, 8)
        padded = patch_embeddings(pixels)
    patch_embeddings.projection.padding = (0, 0)
    with torch.no_grad():
        assert torch.equal(evaluated, Dinov2WithRegistersPatchEmbeddings.forward(patch_embeddings.eval(), pixels))
        patch_embeddings.projection.padding = (8, 8)
        assert torch.equal(padded, Dinov2WithRegistersPatchEmbeddings.forward(patch_embeddings.train(), pixels))
    assert padded.shape == (2, 25, 384)  # 5 x 5 windows: the padded convolution's own output


@pytest.mark.gpu
def test_on_the_gpu_the_step_gives_rfdetrs(tmp_path):
    _, exact_grads, _, _ = training_step(tmp_path / "float32", [], device="cuda")
    expected_loss, expected_grads, _, _ = training_step(tmp_path / "rfdetr", [], autocast=True, device="cuda")
    loss, grads, _, convolutions = training_step(tmp_path / "lean", SPEEDUP, autocast=True, device="cuda")
    assert convolutions == 0
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert_no_further_from_exact(grads, expected_grads, exact_grads)

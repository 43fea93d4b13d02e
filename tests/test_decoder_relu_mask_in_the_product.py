"""decoder_relu_mask_in_the_product: the Triton product gives torch's product masked where the ReLU was off, and a
real Nano training step with it gives rfdetr's loss and gradients, its kernel having made each decoder layer's
masked gradient; without the kernel (the CPU outside Triton's interpreter) the step is decoder_relu_in_the_product's.

On the CPU the kernel runs in Triton's interpreter (`TRITON_INTERPRET=1`, in a fresh interpreter because Triton
reads it when the kernels are defined), in float32: the interpreter's `tl.dot` of bf16 tiles is wrong (Triton 3.8),
so the bf16 product, the one training uses, is checked on the GPU."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.helpers.hopper_kernels import assert_no_register_spills, compile_for_hopper
from tests.helpers.rfdetr_steps import nano_and_batch, nano_training_step
from tests.test_backbone_norm_backward import in_the_interpreter

SPEEDUPS = ["decoder_relu_in_the_product", "decoder_relu_mask_in_the_product"]
# the autograd function whose backward runs the kernel
BACKWARD = "FeedForwardReLUBackward"


def check_product(dtype: torch.dtype, device: str = "cpu") -> None:
    """relu_masked_product against torch's product times the ReLU's mask, on rows, columns and an inner dimension
    that are not whole tiles, with a transposed (strided) first input: within the rounding of `dtype`."""
    from rfdetr_coco_pipeline.hooks.patches.decoder_layer import relu_masked_product

    generator = torch.Generator().manual_seed(0)
    # K = 250: a last step of the inner dimension that is not a whole tile
    a = torch.randn(250, 200, generator=generator).to(dtype).t()  # (200, 250), not contiguous
    b = torch.randn(250, 300, generator=generator).to(dtype)
    relu_out = torch.relu(torch.randn(200, 300, generator=generator)).to(dtype)
    a, b, relu_out = a.to(device), b.to(device), relu_out.to(device)
    expected = (a.float() @ b.float()) * (relu_out > 0)
    found = relu_masked_product(a, b, relu_out)
    assert found.dtype == dtype and found.shape == (200, 300)
    assert torch.equal(found == 0, expected == 0)  # zero exactly where the ReLU was off (and where the sum is 0)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert (found.float() - expected).abs().max() <= tolerance * expected.abs().max()


def test_in_tritons_interpreter_the_product_is_torchs_masked():
    in_the_interpreter(
        "import torch; from tests.test_decoder_relu_mask_in_the_product import check_product; "
        "check_product(torch.float32)"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_the_gpu_the_product_is_torchs_masked(dtype):
    check_product(dtype, "cuda")


def training_step(tmp_path, speedups: list[str]):
    """One Nano training step with `speedups` (10 queries a group): its loss, gradients, and how often the backward
    that runs the masked product ran."""
    module, images, targets = nano_and_batch(tmp_path, num_queries=10)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        _, loss, grads = nano_training_step(module, images, targets, speedups)
    calls = sum(event.count for event in profiler.key_averages() if event.key == BACKWARD)
    return loss, grads, calls


def check_nano_step(tmp_path: str) -> None:
    """A Nano training step with the speedup (and decoder_relu_in_the_product, which it builds on) against rfdetr's:
    the loss and every gradient within float32 rounding; the kernel's backward ran once for each decoder layer;
    rfdetr's forward is back after the block."""
    from pathlib import Path

    from rfdetr.models.transformer import TransformerDecoderLayer

    original = TransformerDecoderLayer.forward_post
    expected_loss, expected_grads, _ = training_step(Path(tmp_path) / "rfdetr", [])
    loss, grads, calls = training_step(Path(tmp_path) / "lean", SPEEDUPS)
    assert TransformerDecoderLayer.forward_post is original
    assert calls == 2
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    assert any(".decoder.layers.0.linear2.bias" in name for name in grads)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


def test_in_tritons_interpreter_a_nano_training_step_gives_rfdetrs_loss_and_gradients(tmp_path):
    in_the_interpreter(
        f"from tests.test_decoder_relu_mask_in_the_product import check_nano_step; check_nano_step({str(tmp_path)!r})"
    )


def test_without_the_kernel_the_step_is_decoder_relu_in_the_products(tmp_path):
    expected_loss, expected_grads, _ = training_step(tmp_path / "relu", SPEEDUPS[:1])
    loss, grads, calls = training_step(tmp_path / "both", SPEEDUPS)
    assert calls == 0
    assert torch.equal(loss, expected_loss)
    assert all(torch.equal(grad, expected_grads[name]) for name, grad in grads.items())


def test_the_kernel_compiles_for_hopper_on_the_tensor_cores_without_register_spills(tmp_path):
    """Triton compiles the bf16 kernel for sm_90a (H100, H200) on any machine at the launch's tiles, warps and stages:
    its product is Hopper's warpgroup matrix instruction (`wgmma`), and ptxas (Triton's own) spills no registers."""
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels")
    from rfdetr_coco_pipeline.hooks.patches import decoder_layer as lever
    from rfdetr_coco_pipeline.hooks.patches.relu_masked_product_kernels import relu_masked_product_kernel

    signature = {name: "*bf16" for name in ("a_ptr", "b_ptr", "relu_out_ptr", "c_ptr")}
    signature |= {name: "i32" for name in ("M", "N", "K")}
    constants = {"BLOCK_M": lever.TILE_M, "BLOCK_N": lever.TILE_N, "BLOCK_K": lever.TILE_K, "GROUP_M": lever.GROUP_M}
    constants["INPUT_PRECISION"] = "tf32"
    signature |= dict.fromkeys(constants, "constexpr")
    # what a launch on Nano's tensors tells Triton: pointers aligned to 16 bytes, N (2,048) and K (256) multiples of 16
    aligned = ("a_ptr", "b_ptr", "relu_out_ptr", "c_ptr", "N", "K")
    divisible = {(list(signature).index(name),): [["tt.divisibility", 16]] for name in aligned}
    options = {"num_warps": lever.WARPS, "num_stages": lever.STAGES}
    ptx = compile_for_hopper(relu_masked_product_kernel, signature, constants, options, divisible)
    assert "wgmma" in ptx
    assert_no_register_spills(ptx, tmp_path)

"""Checks of the Triton product `decoder_relu_mask_in_the_product`'s backward runs (`activation_grad_product_kernels`):
the product against torch's, its Hopper build, and Nano steps with and without it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tests.helpers.hopper_kernels import assert_no_register_spills, compile_for_hopper
from tests.helpers.rfdetr_steps import nano_and_batch, nano_training_step


def check_product(dtype: torch.dtype, device: str = "cpu") -> None:
    """The custom op against torch's product masked where ReLU was off, on rows, columns and an inner dimension that
    are not whole tiles (K = 250), with a transposed (strided) first input: within the rounding of `dtype`, and zero
    exactly where the ReLU was off."""
    from rfdetr_coco_pipeline.hooks.patches.feed_forward_products import relu_masked_product

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(250, 200, generator=generator).to(dtype).t().to(device)  # (200, 250), not contiguous
    b = torch.randn(250, 300, generator=generator).to(dtype).to(device)
    saved = torch.relu(torch.randn(200, 300, generator=generator)).to(dtype).to(device)  # ReLU's output
    expected, found = (a.float() @ b.float()) * (saved > 0), relu_masked_product(a, b, saved)
    assert torch.equal(found == 0, expected == 0)  # zero exactly where the ReLU was off (and where the sum is 0)
    assert found.dtype == dtype and found.shape == (200, 300)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert (found.float() - expected).abs().max() <= tolerance * expected.abs().max()


def nano_step_with_backward_calls(tmp_path: Path, speedups: list[str], backward: str) -> tuple:
    """One Nano training step with `speedups` (10 queries a group): its loss, gradients, and how often the autograd
    backward named `backward` ran."""
    module, images, targets = nano_and_batch(tmp_path, num_queries=10)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        _, loss, grads = nano_training_step(module, images, targets, speedups)
    calls = sum(event.count for event in profiler.key_averages() if event.key == backward)
    return loss, grads, calls


def check_compiles_for_hopper(tmp_path: Path) -> None:
    """Triton compiles the bf16 kernel for sm_90a (H100, H200) on any machine at the launch's tiles,
    warps, stages and saved tile's place: its product is Hopper's warpgroup matrix instruction (`wgmma`), and ptxas
    (Triton's own) spills no registers."""
    from rfdetr_coco_pipeline.hooks.patches import feed_forward_products as launch
    from rfdetr_coco_pipeline.hooks.patches.activation_grad_product_kernels import activation_grad_product_kernel

    signature = {name: "*bf16" for name in ("a_ptr", "b_ptr", "saved_ptr", "c_ptr")}
    signature |= {name: "i32" for name in ("M", "N", "K")}
    constants = {"BLOCK_M": launch.TILE_M, "BLOCK_N": launch.TILE_N, "BLOCK_K": launch.TILE_K}
    constants |= {"GROUP_M": launch.GROUP_M, "INPUT_PRECISION": "tf32"}
    constants |= {"SAVED_FIRST": launch.SAVED_FIRST}
    signature |= dict.fromkeys(constants, "constexpr")
    # what a launch on Nano's tensors tells Triton: pointers aligned to 16 bytes, N and K multiples of 16 (the
    # decoder's 2,048 and 256)
    aligned = ("a_ptr", "b_ptr", "saved_ptr", "c_ptr", "N", "K")
    divisible = {(list(signature).index(name),): [["tt.divisibility", 16]] for name in aligned}
    options = {"num_warps": launch.WARPS, "num_stages": launch.STAGES}
    ptx = compile_for_hopper(activation_grad_product_kernel, signature, constants, options, divisible)
    assert "wgmma" in ptx
    assert_no_register_spills(ptx, tmp_path)


def check_step_with_the_kernel(tmp_path: Path, speedups: list[str], backward: str, calls: int, parameter: str) -> None:
    """A Nano training step with `speedups` against rfdetr's: the loss and every gradient (among them one whose
    name holds `parameter`) within float32 rounding, and the kernel's backward `backward` ran `calls` times."""
    expected_loss, expected_grads, _ = nano_step_with_backward_calls(tmp_path / "rfdetr", [], backward)
    loss, grads, ran = nano_step_with_backward_calls(tmp_path / "lean", speedups, backward)
    assert ran == calls
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    assert any(parameter in name for name in grads)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


def check_step_without_the_kernel(tmp_path: Path, speedups: list[str], baseline: list[str], backward: str) -> None:
    """Where the kernel cannot run, a Nano step with `speedups` is the step with `baseline`, bit for bit, and the
    kernel's backward `backward` never ran."""
    expected_loss, expected_grads, _ = nano_step_with_backward_calls(tmp_path / "baseline", baseline, backward)
    loss, grads, calls = nano_step_with_backward_calls(tmp_path / "named", speedups, backward)
    assert calls == 0
    assert torch.equal(loss, expected_loss)
    assert all(torch.equal(grad, expected_grads[name]) for name, grad in grads.items())

"""decoder_relu_mask_in_the_product: the Triton product gives torch's product masked where the ReLU was off, and a
real Nano training step with it gives rfdetr's loss and gradients, its kernel having made each decoder layer's
masked gradient; without the kernel (the CPU outside Triton's interpreter) the step is decoder_relu_in_the_product's.

On the CPU the kernel runs in Triton's interpreter (`TRITON_INTERPRET=1`, in a fresh interpreter because Triton
reads it when the kernels are defined), in float32: the interpreter's `tl.dot` of bf16 tiles is wrong (Triton 3.8),
so the bf16 product, the one training uses, is checked on the GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.activation_grad_products import (
    check_compiles_for_hopper,
    check_product,
    check_step_with_the_kernel,
    check_step_without_the_kernel,
)
from tests.helpers.triton_interpreter import in_the_interpreter

SPEEDUPS = ["decoder_relu_in_the_product", "decoder_relu_mask_in_the_product"]
BACKWARD = "FeedForwardReLUBackward"  # the autograd function whose backward runs the kernel


def test_in_tritons_interpreter_the_product_is_torchs_masked():
    in_the_interpreter(
        "import torch; from tests.helpers.activation_grad_products import check_product; check_product(torch.float32)"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_the_gpu_the_product_is_torchs_masked(dtype):
    check_product(dtype, "cuda")


def check_nano_step(tmp_path: str) -> None:
    """A Nano training step with the speedup (and decoder_relu_in_the_product, which it builds on) against rfdetr's:
    the loss and every gradient within float32 rounding; the kernel's backward ran once for each decoder layer;
    rfdetr's forward is back after the block."""
    from pathlib import Path

    from rfdetr.models.transformer import TransformerDecoderLayer

    original = TransformerDecoderLayer.forward_post
    check_step_with_the_kernel(Path(tmp_path), SPEEDUPS, BACKWARD, calls=2, parameter=".decoder.layers.0.linear2.bias")
    assert TransformerDecoderLayer.forward_post is original


def test_in_tritons_interpreter_a_nano_training_step_gives_rfdetrs_loss_and_gradients(tmp_path):
    in_the_interpreter(
        f"from tests.test_decoder_relu_mask_in_the_product import check_nano_step; check_nano_step({str(tmp_path)!r})"
    )


def test_without_the_kernel_the_step_is_decoder_relu_in_the_products(tmp_path):
    check_step_without_the_kernel(tmp_path, SPEEDUPS, SPEEDUPS[:1], BACKWARD)


def test_the_kernel_compiles_for_hopper_on_the_tensor_cores_without_register_spills(tmp_path):
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels")
    check_compiles_for_hopper(tmp_path)

"""backbone_gelu_grad_in_the_product: the Triton product gives torch's product through the exact GELU's backward,
and a real Nano training step with it gives rfdetr's loss and gradients, its kernel having made each backbone
block's gradient; without the kernel (the CPU outside Triton's interpreter) the step is rfdetr's own.

On the CPU the kernel runs in Triton's interpreter, in float32 (the interpreter's bf16 `tl.dot` is wrong, Triton
3.8), so the bf16 product, the one training uses, is checked on the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.activation_grad_products import (
    check_compiles_for_hopper,
    check_product,
    check_step_with_the_kernel,
    check_step_without_the_kernel,
)
from tests.helpers.rfdetr_steps import nano_and_batch
from tests.test_backbone_norm_backward import in_the_interpreter

SPEEDUP = "backbone_gelu_grad_in_the_product"
BACKWARD = "FeedForwardGELUBackward"  # the autograd function whose backward runs the kernel


def test_in_tritons_interpreter_the_product_is_torchs_through_gelus_backward():
    in_the_interpreter(
        "import torch; from tests.helpers.activation_grad_products import check_product; "
        "check_product('gelu', torch.float32)"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_the_gpu_the_product_is_torchs_through_gelus_backward(dtype):
    check_product("gelu", dtype, "cuda")


def check_nano_step(tmp_path: str) -> None:
    """A Nano training step with the speedup against rfdetr's: the loss and every gradient within float32
    rounding; the kernel's backward ran once for each of the backbone's 12 blocks; rfdetr's forward is back after
    the block."""
    from pathlib import Path

    from rfdetr.models.backbone.dinov2_with_windowed_attn import Dinov2WithRegistersMLP

    original = Dinov2WithRegistersMLP.forward
    check_step_with_the_kernel(Path(tmp_path), [SPEEDUP], BACKWARD, calls=12, parameter=".mlp.fc1.bias")
    assert Dinov2WithRegistersMLP.forward is original


def test_in_tritons_interpreter_a_nano_training_step_gives_rfdetrs_loss_and_gradients(tmp_path):
    in_the_interpreter(
        f"from tests.test_backbone_gelu_grad_in_the_product import check_nano_step; check_nano_step({str(tmp_path)!r})"
    )


def test_without_the_kernel_the_step_is_rfdetrs(tmp_path):
    check_step_without_the_kernel(tmp_path, [SPEEDUP], [], BACKWARD)


def test_a_block_of_another_gelu_or_outside_training_is_rfdetrs(tmp_path, monkeypatch):
    """Only the exact GELU, whose derivative the kernel applies, in training, where the kernel can run, takes the
    kernel's way; the tanh GELU and a block in evaluation go to rfdetr's own forward."""
    from transformers.activations import GELUActivation, GELUTanh

    from rfdetr_coco_pipeline.hooks.patches.backbone_gelu_grad_in_the_product import _applies

    module, _, _ = nano_and_batch(tmp_path)
    mlp = next(m for m in module.modules() if type(m).__name__ == "Dinov2WithRegistersMLP").train()
    x = torch.randn(4, mlp.fc1.in_features)
    assert type(mlp.activation) is GELUActivation and mlp.activation.act is F.gelu  # rfdetr's: the exact GELU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not _applies(mlp, x)  # the CPU outside Triton's interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # where the kernel can run
    assert _applies(mlp, x)
    assert not _applies(mlp.eval(), x)
    mlp.train().activation = GELUTanh()
    assert not _applies(mlp, x)


def test_the_kernel_compiles_for_hopper_on_the_tensor_cores_without_register_spills(tmp_path):
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels")
    check_compiles_for_hopper("gelu", tmp_path)

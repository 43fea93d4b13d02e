"""backbone_norm_backward_in_one_pass: the one-pass kernel gives autograd's gradients of x + scale * a and the
LayerNorm after it, a real Nano training step with it gives rfdetr's loss and gradients, and elsewhere the layer is
rfdetr's.

On the CPU the kernel runs in Triton's interpreter (`TRITON_INTERPRET=1`, in a fresh interpreter because Triton
reads it when the kernels are defined); on the GPU it runs compiled."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from rfdetr_coco_pipeline.hooks import applied, select_speedups
from tests.helpers.hopper_kernels import assert_no_register_spills, compile_for_hopper
from tests.helpers.rfdetr_steps import (
    BF16_ON_CPU,
    assert_gradients_alike,
    assert_no_further_from_exact,
    nano_and_batch,
    nano_training_step,
)
from tests.helpers.triton_interpreter import in_the_interpreter

SPEEDUP = ["backbone_norm_backward_in_one_pass"]


def check_kernel_against_autograd(
    rows: int, channels: int, a_dtype: torch.dtype, programs: int, tile: int | None = None
) -> None:
    """residual_norm (its kernel limited to `programs` programs, in tiles of `tile` rows, else the shipped TILE)
    against autograd of torch's own ops: h, z and the gradients of x, a, scale, weight and bias, each within float32
    rounding of the reference's largest value."""
    from rfdetr_coco_pipeline.hooks.patches import backbone_norm_backward_in_one_pass as lever

    lever.PROGRAMS = programs
    lever.TILE = tile or lever.TILE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, channels, generator=generator, requires_grad=True)
    a = torch.randn(rows, channels, generator=generator).to(a_dtype).requires_grad_(True)
    norm = torch.nn.LayerNorm(channels, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(channels, generator=generator) + 0.5)
        norm.bias.copy_(torch.randn(channels, generator=generator))
    scale = (torch.rand(channels, generator=generator) + 0.5).requires_grad_(True)
    grad_h, grad_z = torch.randn(rows, channels, generator=generator), torch.randn(rows, channels, generator=generator)
    inputs = (x, a, scale, norm.weight, norm.bias)

    h, z = lever.residual_norm(x, a, scale, norm)
    ours = [h, z, *torch.autograd.grad((h, z), inputs, (grad_h, grad_z))]
    h = x + a * scale
    z = F.layer_norm(h, (channels,), norm.weight, norm.bias, norm.eps)
    theirs = [h, z, *torch.autograd.grad((h, z), inputs, (grad_h, grad_z))]
    for name, mine, reference in zip(("h", "z", "x", "a", "scale", "weight", "bias"), ours, theirs, strict=True):
        assert mine.dtype == reference.dtype and mine.shape == reference.shape, name
        difference = float((mine - reference).detach().float().abs().max() / reference.detach().float().abs().max())
        assert difference < (1e-2 if reference.dtype == torch.bfloat16 else 1e-5), (name, difference)


def test_in_tritons_interpreter_the_kernel_gives_autograds_values_and_gradients():
    # 71 rows over 2 programs: each program walks many tiles, and in tiles of 4 the last one is partly empty; 24
    # channels in a block of 32: the row is masked too
    in_the_interpreter(
        "from tests.test_backbone_norm_backward import check_kernel_against_autograd as check; import torch; "
        "check(71, 24, torch.float32, programs=2); check(71, 24, torch.bfloat16, programs=2, tile=4); "
        "check(5, 384, torch.bfloat16, programs=1024)"
    )


def test_the_kernel_compiles_for_hopper_without_register_spills(tmp_path):
    """Triton compiles the kernel for sm_90 (H100, H200) on any machine: the interpreter does not check that. ptxas
    (Triton's own) reports the registers it needs at the launch's tile and warps: none spill to memory."""
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels")
    from rfdetr_coco_pipeline.hooks.patches import backbone_norm_backward_in_one_pass as lever
    from rfdetr_coco_pipeline.hooks.patches.residual_norm_kernels import residual_norm_backward_kernel

    pointers = {"grad_z_ptr": "*bf16", "grad_h_ptr": "*fp32", "h_ptr": "*fp32", "a_ptr": "*bf16"}
    pointers |= {name: "*fp32" for name in ("mean_ptr", "rstd_ptr", "scale_ptr", "weight_ptr", "grad_x_ptr")}
    pointers |= {"grad_a_ptr": "*bf16"}
    pointers |= {f"partial_{name}_ptr": "*fp32" for name in ("scale", "weight", "bias")}
    signature = {**pointers, "rows": "i32", "C": "i32", "TILE": "constexpr", "BLOCK_C": "constexpr"}
    constants = {"TILE": lever.TILE, "BLOCK_C": lever.triton_block(384)}
    ptx = compile_for_hopper(residual_norm_backward_kernel, signature, constants, {"num_warps": lever.WARPS})
    assert_no_register_spills(ptx, tmp_path)


def training_step(tmp_path, speedups: list[str], autocast: bool = False, device: str = "cpu", **model: object):
    """A Nano training step with `speedups` (`model`: further RFDETRNanoConfig settings): the loss, every gradient,
    and how often the layers' norm1 and norm2 ran as modules."""
    module, images, targets = nano_and_batch(tmp_path, device, **model)
    norms = []
    for layer in module.model.backbone[0].encoder.encoder.encoder.layer:
        layer.norm1.register_forward_hook(lambda *_: norms.append("norm1"))
        layer.norm2.register_forward_hook(lambda *_: norms.append("norm2"))
    _, loss, grads = nano_training_step(module, images, targets, speedups, autocast, device)
    return loss, grads, Counter(norms)


def check_nano_step(tmp_path: str) -> None:
    """The step with the speedup against rfdetr's, in float32 and under bf16 autocast."""
    from pathlib import Path

    tmp = Path(tmp_path)
    expected_loss, expected_grads, rfdetr_norms = training_step(tmp / "rfdetr", [])
    loss, grads, norms = training_step(tmp / "lean", SPEEDUP)
    assert rfdetr_norms == {"norm1": 12, "norm2": 12}
    assert norms == {"norm1": 1}  # but the first layer's norm1, every norm went through the kernel's path
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert_gradients_alike(grads, expected_grads, most_apart=2e-4)
    expected_loss, expected_grads, _ = training_step(tmp / "rfdetr-bf16", [], autocast=True, **BF16_ON_CPU)
    loss, grads, _ = training_step(tmp / "lean-bf16", SPEEDUP, autocast=True, **BF16_ON_CPU)
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert_gradients_alike(grads, expected_grads, least_cosine=0.999)


def test_in_tritons_interpreter_a_nano_training_step_gives_rfdetrs_loss_and_gradients(tmp_path):
    in_the_interpreter(
        f"from tests.test_backbone_norm_backward import check_nano_step; check_nano_step({str(tmp_path)!r})"
    )


def check_compiled_encoder(tmp_path: str) -> None:
    """The backbone's encoder compiled whole (`fullgraph=True`: no graph breaks) with the speedup, against rfdetr's
    eager encoder: every hidden state it returns and the gradients within float32 rounding. The encoder keeps its
    first four layers, three of windowed attention and one of full attention, both kinds it has: compiling all
    twelve on the CPU takes minutes and checks nothing more."""
    module, _, _ = nano_and_batch(tmp_path)
    encoder = module.model.backbone[0].encoder.encoder.encoder.train()
    encoder.layer = encoder.layer[:4]
    assert encoder.config.window_block_indexes[:4] == [0, 1, 2, 4]  # layer 3 attends in full
    # 2 images of 2 x 2 windows of 4 patches and the class token, as at 64 px
    x = torch.randn(8, 5, 384, generator=torch.Generator().manual_seed(2), requires_grad=True)
    weights = [encoder.layer[0].norm1.weight, encoder.layer[2].norm2.weight, encoder.layer[3].layer_scale2.lambda1]

    def run(forward):
        x.grad = None
        encoder.zero_grad()
        states = forward(x, output_hidden_states=True).hidden_states
        sum(state.square().sum() for state in states).backward()
        return [*(state.detach() for state in states), x.grad, *(weight.grad for weight in weights)]

    expected = run(encoder.forward)
    with applied(select_speedups(SPEEDUP, "1.11.2", device_kind="cpu")):
        found = run(torch.compile(encoder.forward, fullgraph=True))
    assert len(found) == len(expected) == 5 + 4  # the input and each layer's output, then the gradients
    for mine, reference in zip(found, expected, strict=True):
        assert (mine - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_in_tritons_interpreter_the_compiled_encoder_gives_rfdetrs(tmp_path):
    in_the_interpreter(
        "from tests.test_backbone_norm_backward import check_compiled_encoder; "
        f"check_compiled_encoder({str(tmp_path)!r})"
    )


def test_without_the_kernel_evaluation_and_the_cpu_keep_rfdetrs_layer(tmp_path):
    """Without Triton's interpreter a CPU step takes rfdetr's path; so does evaluation."""
    assert os.environ.get("TRITON_INTERPRET") != "1"
    _, _, norms = training_step(tmp_path, SPEEDUP)
    assert norms == {"norm1": 12, "norm2": 12}
    module, images, _ = nano_and_batch(tmp_path)
    outputs = []
    for speedups in ([], SPEEDUP):
        with applied(select_speedups(speedups, "1.11.2", device_kind="cpu")), torch.no_grad():
            outputs.append(module.model.eval()(images)["pred_boxes"])
    assert torch.equal(*outputs)


@pytest.mark.gpu
def test_on_the_gpu_the_step_gives_rfdetrs(tmp_path):
    _, exact_grads, _ = training_step(tmp_path / "float32", [], device="cuda")
    expected_loss, expected_grads, _ = training_step(tmp_path / "rfdetr", [], autocast=True, device="cuda")
    loss, grads, norms = training_step(tmp_path / "lean", SPEEDUP, autocast=True, device="cuda")
    assert norms == {"norm1": 1}
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert_no_further_from_exact(grads, expected_grads, exact_grads)

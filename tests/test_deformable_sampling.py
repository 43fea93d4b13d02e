"""The deformable_sampling speedup: the Triton sampling kernels give F.grid_sample's values and gradients.

On the CPU the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, in a fresh interpreter because Triton
reads it when the kernels are defined); on the GPU they run compiled, at RF-DETR Nano's real shapes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from rfdetr_coco_pipeline.hooks.patches.deformable_sampling import bilinear_sample, deformable_sampling
from tests.helpers.triton_interpreter import in_the_interpreter


def differences(device: str, maps: int, height: int, width: int, queries: int, seed: int = 0) -> dict[str, float]:
    """Largest differences between our kernels and F.grid_sample: output, gradients by map and by grid, each
    relative to the largest value of F.grid_sample's; grids reach past the borders on every side."""
    generator = torch.Generator().manual_seed(seed)
    value = torch.randn(maps, 16, height, width, generator=generator).to(device).requires_grad_(True)
    grid = (torch.rand(maps, queries, 2, 2, generator=generator) * 2.4 - 1.2).to(device).requires_grad_(True)
    grad = torch.randn(maps, 16, queries, 2, generator=generator).to(device)
    ours = bilinear_sample(value, grid)
    theirs = F.grid_sample(value, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    our_grads = torch.autograd.grad(ours, (value, grid), grad)
    their_grads = torch.autograd.grad(theirs, (value, grid), grad)
    pairs = {"output": (ours, theirs), "grad_value": (our_grads[0], their_grads[0])}
    pairs["grad_grid"] = (our_grads[1], their_grads[1])
    return {
        name: float((mine - reference).abs().max() / reference.abs().max()) for name, (mine, reference) in pairs.items()
    }


def test_in_tritons_interpreter_the_kernels_give_grid_samples_values_and_gradients():
    # 2 maps of 6 x 5 pixels, 37 queries x 2 points: 74 samples, more than one block of 64 and not a multiple of it
    code = (
        "import json; from tests.test_deformable_sampling import differences; "
        "print(json.dumps(differences('cpu', maps=2, height=6, width=5, queries=37)))"
    )
    found = json.loads(in_the_interpreter(code).strip().splitlines()[-1])
    assert found.keys() == {"output", "grad_value", "grad_grid"}
    assert all(difference < 1e-5 for difference in found.values()), found


def test_other_devices_keep_rfdetrs_sampling():
    from rfdetr.models.ops.functions import ms_deform_attn_func

    value, grid = torch.randn(2, 16, 6, 5), torch.rand(2, 7, 2, 2) * 2 - 1
    with deformable_sampling():
        sampled = ms_deform_attn_func._bilinear_grid_sample(value, grid, padding_mode="zeros", align_corners=False)
    assert torch.equal(sampled, F.grid_sample(value, grid, mode="bilinear", padding_mode="zeros", align_corners=False))


def test_without_triton_rfdetrs_sampling_stays_and_the_log_says_so(monkeypatch, caplog):
    import importlib.util

    from rfdetr.models.ops.functions import ms_deform_attn_func

    original = ms_deform_attn_func._bilinear_grid_sample
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "triton" else real_find_spec(name))
    with caplog.at_level("WARNING"), deformable_sampling():
        assert ms_deform_attn_func._bilinear_grid_sample is original
    assert "Triton is not installed" in caplog.text


@pytest.mark.gpu
def test_on_the_gpu_the_kernels_give_grid_samples_values_and_gradients_at_nanos_shapes():
    # batch 128 x 16 heads, a 24 x 24 map (384 px / 16), 3,900 queries (300 x 13 groups) x 2 points
    found = differences("cuda", maps=2048, height=24, width=24, queries=3900)
    assert all(difference < 1e-5 for difference in found.values()), found
    found = differences("cuda", maps=3, height=7, width=9, queries=50, seed=1)
    assert all(difference < 1e-5 for difference in found.values()), found


@pytest.mark.gpu
def test_on_the_gpu_rfdetrs_deformable_attention_compiles_with_our_kernels_and_keeps_its_values():
    from rfdetr.models.ops.functions import ms_deform_attn_core_pytorch

    generator = torch.Generator().manual_seed(2)
    batch, heads, queries, points = 4, 16, 300, 2
    value = torch.randn(batch, heads, 16, 24 * 24, generator=generator).cuda().requires_grad_(True)
    locations = torch.rand(batch, queries, heads, 1, points, 2, generator=generator).cuda().requires_grad_(True)
    weights = torch.rand(batch, queries, heads, 1, points, generator=generator).cuda().requires_grad_(True)
    shapes = torch.tensor([[24, 24]], device="cuda")

    def attend():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return ms_deform_attn_core_pytorch(value, shapes, locations, weights, [(24, 24)])

    def gradients(out):
        return torch.autograd.grad(out.float().square().sum(), (value, locations, weights))

    expected = attend()
    expected_grads = gradients(expected)
    with deformable_sampling():
        out = torch.compile(attend, fullgraph=True)()  # fullgraph: the operator must not break the graph
        grads = gradients(out)  # through the compiled backward, with our backward kernel
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)

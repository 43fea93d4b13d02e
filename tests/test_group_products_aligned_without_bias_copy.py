"""group_products_aligned_without_bias_copy: a real Nano training step gives rfdetr's loss, gradients and selected
proposals with it, alone and under two_stage_ranking_without_autograd; it no longer calls `baddbmm` (whose first act
is to copy the broadcast bias into its output), and its products have 96 class columns, not 91, and 8 box columns,
not 4."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.helpers.rfdetr_steps import nano_and_batch, nano_training_step

SPEEDUP = "group_products_aligned_without_bias_copy"
QUERIES = 10  # as in tests/test_two_stage_ranking.py: the ranking keeps 10 of the 16 positions an image at 64 px


def training_step(tmp_path, speedups: list[str]):
    """One Nano training step with `speedups`: its loss, gradients, the proposals that reach the loss, and the
    batched products it called, each with the sizes of its matrices' last two dimensions."""
    module, images, targets = nano_and_batch(tmp_path, num_queries=QUERIES)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        outputs, loss, grads = nano_training_step(module, images, targets, speedups)
    proposals = {key: value.detach() for key, value in outputs["enc_outputs"].items()}
    products = {
        (event.key, size)
        for event in profiler.key_averages(group_by_input_shape=True)
        if event.key in ("aten::bmm", "aten::baddbmm")
        for shape in event.input_shapes
        if len(shape) == 3
        for size in shape[-2:]
    }
    return loss, grads, proposals, products


@pytest.fixture(scope="module")
def rfdetrs_step(tmp_path_factory):
    return training_step(tmp_path_factory.mktemp("rfdetr"), [])


@pytest.mark.parametrize("others", [[], ["two_stage_ranking_without_autograd"]], ids=["alone", "with_the_ranking"])
def test_the_step_gives_rfdetrs_loss_gradients_and_proposals_without_baddbmm(tmp_path, rfdetrs_step, others):
    from rfdetr.models import transformer

    original = transformer._batched_group_linear
    expected_loss, expected_grads, expected_proposals, rfdetrs_products = rfdetrs_step
    loss, grads, proposals, products = training_step(tmp_path, [*others, SPEEDUP])
    assert transformer._batched_group_linear is original  # rfdetr's function is back after the block
    # rfdetr's products: baddbmm forward, with the class head's 91 columns and the box head's 4 (bmm backward);
    # with the speedup: bmm only, with 96 and 8
    assert {("aten::baddbmm", 91), ("aten::baddbmm", 4), ("aten::bmm", 91)} <= rfdetrs_products
    assert {name for name, _ in products} == {"aten::bmm"}
    assert {("aten::bmm", 96), ("aten::bmm", 8)} <= products
    assert not {("aten::bmm", 91), ("aten::bmm", 4)} & products
    for key, value in proposals.items():
        assert torch.allclose(value, expected_proposals[key], rtol=1e-5, atol=1e-6), key
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
def test_the_product_has_rfdetrs_dtype_shape_and_values(autocast):
    # under autocast rfdetr's baddbmm gives bf16; a float32 bias added after a bf16 product would give float32, and
    # every operation after it would run in float32
    from rfdetr.models import transformer

    from rfdetr_coco_pipeline.hooks.patches.group_products_aligned_without_bias_copy import aligned_and_bias_after

    aligned = aligned_and_bias_after(transformer._batched_group_linear)
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (
        torch.randn(*shape, generator=generator) for shape in ((13, 2, 48, 256), (13, 91, 256), (13, 91))
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        expected, result = transformer._batched_group_linear(x, weight, bias), aligned(x, weight, bias)
    assert (result.dtype, result.shape) == (expected.dtype, expected.shape)
    assert expected.dtype == (torch.bfloat16 if autocast else torch.float32) and expected.shape == (13, 2, 48, 91)
    tolerance = {"rtol": 2e-2, "atol": 5e-2} if autocast else {"rtol": 1e-5, "atol": 1e-5}
    assert torch.allclose(result.float(), expected.float(), **tolerance)

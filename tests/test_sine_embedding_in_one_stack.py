"""sine_embedding_in_one_stack: the embedding is rfdetr's bit for bit, and a real Nano training step that embeds its
reference boxes with one sine and one cosine operation, not four of each, gives rfdetr's loss and gradients."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.helpers.rfdetr_steps import nano_and_batch, nano_training_step

SPEEDUP = "sine_embedding_in_one_stack"


@pytest.mark.parametrize("coordinates", [2, 4])
def test_the_embedding_is_rfdetrs_and_its_gradient_within_rounding(coordinates):
    from rfdetr.models.transformer import gen_sineembed_for_position

    from rfdetr_coco_pipeline.hooks.patches.sine_embedding_in_one_stack import in_one_stack

    boxes = torch.rand(3, 50, coordinates, generator=torch.Generator().manual_seed(0), requires_grad=True)
    expected = gen_sineembed_for_position(boxes, 128)
    result = in_one_stack(gen_sineembed_for_position)(boxes, 128)
    assert result.shape == expected.shape == (3, 50, 128 * coordinates)
    assert torch.equal(result, expected)
    upstream = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    (expected_grad,) = torch.autograd.grad(expected, boxes, upstream)
    (grad,) = torch.autograd.grad(result, boxes, upstream)
    assert torch.allclose(grad, expected_grad, rtol=1e-5, atol=1e-4)


def training_step(tmp_path, speedups: list[str]):
    """One Nano training step with `speedups`: its loss, gradients, and how many sine and cosine operations ran."""
    module, images, targets = nano_and_batch(tmp_path)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        _, loss, grads = nano_training_step(module, images, targets, speedups)
    calls = {event.key: event.count for event in profiler.key_averages() if event.key in ("aten::sin", "aten::cos")}
    return loss, grads, calls


def test_the_step_embeds_in_one_stack_and_gives_rfdetrs_loss_and_gradients(tmp_path):
    from rfdetr.models import transformer

    original = transformer.gen_sineembed_for_position
    expected_loss, expected_grads, rfdetrs_calls = training_step(tmp_path / "rfdetr", [])
    loss, grads, calls = training_step(tmp_path / "one_stack", [SPEEDUP])
    assert transformer.gen_sineembed_for_position is original  # rfdetr's function is back after the block
    # Nano embeds its reference boxes once a step; forward and backward, rfdetr takes a sine and a cosine of each
    # of the 4 coordinates' angles, this one of each for all four: 3 fewer of each, twice
    assert {op: rfdetrs_calls[op] - calls[op] for op in ("aten::sin", "aten::cos")} == {"aten::sin": 6, "aten::cos": 6}
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name

"""sine_embedding_frequencies_once: the decoder's sine embedding of its boxes is rfdetr's, value for value, and so is
its gradient, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks import applied, select_speedups

SPEEDUP = ["sine_embedding_frequencies_once"]


def embedding_and_gradient(positions: torch.Tensor, speedups: list[str], compiled: bool = False):
    from rfdetr.models import transformer

    positions = positions.clone().requires_grad_()
    with applied(select_speedups(speedups, "1.11.2", device_kind="cpu")):
        embed = transformer.gen_sineembed_for_position
        embedding = (torch.compile(embed, fullgraph=True) if compiled else embed)(positions, 128)
    embedding.backward(torch.linspace(-1, 1, embedding.numel()).view_as(embedding))
    return embedding.detach(), positions.grad


@pytest.mark.parametrize("coordinates", [4, 2])
def test_the_embedding_and_its_gradient_are_rfdetrs_value_for_value(coordinates):
    from rfdetr.models import transformer

    original = transformer.gen_sineembed_for_position
    positions = torch.rand(3, 50, coordinates, generator=torch.Generator().manual_seed(0))
    expected, expected_grad = embedding_and_gradient(positions, [])
    embedding, grad = embedding_and_gradient(positions, SPEEDUP)
    assert transformer.gen_sineembed_for_position is original  # rfdetr's function is back after the block
    assert embedding.shape == (3, 50, 128 * coordinates)
    assert torch.equal(embedding, expected)
    assert torch.equal(grad, expected_grad)


def test_compiled_the_embedding_is_rfdetrs_within_rounding():
    """Compiled (Inductor, as the train stage runs it), whole: the frequencies reach the kernel as a tensor."""
    positions = torch.rand(2, 40, 4, generator=torch.Generator().manual_seed(1))
    expected, expected_grad = embedding_and_gradient(positions, [])
    embedding, grad = embedding_and_gradient(positions, SPEEDUP, compiled=True)
    assert torch.allclose(embedding, expected, atol=1e-5)
    assert torch.allclose(grad, expected_grad, rtol=1e-4, atol=1e-4)

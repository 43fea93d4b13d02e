"""The padding_in_one_copy speedup: the matcher's targets padded in two operations equal torch's pad_sequence."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from rfdetr_coco_pipeline.hooks.patches.padding_in_one_copy import padded_in_one_copy, padding_in_one_copy
from tests.helpers.rfdetr_steps import counted_calls, index_pairs, solve_all_layers, tiny_detector_step


@pytest.mark.parametrize(
    ("sizes", "trailing", "dtype"),
    [
        ([3, 0, 1, 5], (), torch.int64),  # labels, an image without objects among them
        ([3, 0, 1, 5], (4,), torch.float32),  # boxes
        ([0, 0], (4,), torch.float32),  # no objects in the whole batch
        ([2, 7, 7], (), torch.int64),  # the longest twice
    ],
)
def test_the_padding_equals_pad_sequences(sizes, trailing, dtype):
    generator = torch.Generator().manual_seed(sum(sizes))
    sequences = [(torch.rand((n, *trailing), generator=generator) * 90).to(dtype) for n in sizes]
    for value in (0.0, -1.0):
        expected = pad_sequence(sequences, batch_first=True, padding_value=value)
        ours = padded_in_one_copy(sequences, value)
        assert ours.dtype == expected.dtype and ours.shape == expected.shape
        assert torch.equal(ours, expected)


def test_the_matchers_assignment_is_unchanged_and_other_calls_go_to_torch(tmp_path, monkeypatch):
    from rfdetr.models import matcher

    from rfdetr_coco_pipeline.hooks.patches import padding_in_one_copy as extension

    criterion, outputs, targets = tiny_detector_step("cpu", 5, tmp_path)
    plain = solve_all_layers(criterion, outputs, targets)
    original = matcher.pad_sequence
    calls = counted_calls(monkeypatch, extension, "padded_in_one_copy")
    with padding_in_one_copy():
        assert matcher.pad_sequence is not original
        ours = solve_all_layers(criterion, outputs, targets)
        assert calls, "the matcher did not pad through the extension"
        sequences = [torch.ones(2, 3), torch.ones(1, 3)]
        # time-first padding is not what the matcher asks for: torch's own function answers it
        assert torch.equal(matcher.pad_sequence(sequences), pad_sequence(sequences))
    assert matcher.pad_sequence is original
    assert plain is not None and ours is not None
    assert index_pairs(ours) == index_pairs(plain)


@pytest.mark.gpu
def test_on_the_gpu_the_padding_equals_pad_sequences_and_nothing_waits():
    sequences = [torch.rand(n, 4, device="cuda") for n in (3, 0, 1, 5)]
    expected = pad_sequence(sequences, batch_first=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours = padded_in_one_copy(sequences)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(ours, expected)

"""The matcher pads a batch's targets in two GPU operations instead of one copy per image.

rfdetr's matcher pads each image's target labels and boxes to the batch's largest count with torch's
`pad_sequence`, twice per call, for every layer stack it matches. On a GPU that is one small copy per image (128 at
batch 128), and the host spends its time launching them while the GPU waits.

This replaces the name `pad_sequence` in rfdetr's private `rfdetr.models.matcher` module with one that concatenates
the sequences (one kernel) and writes them into the padded tensor with one indexed copy, the index built on the host
from the sequence lengths (known there) and sent to the GPU without waiting. Calls it does not cover (not
batch-first, left padding, a single sequence) go to torch's function. Guarantees: `pad_sequence`'s result, element
for element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, send_without_waiting


def padded_in_one_copy(sequences: Sequence[Tensor], padding_value: float = 0.0) -> Tensor:
    """`pad_sequence(sequences, batch_first=True, padding_value=padding_value)`, in two operations on the device."""
    sizes = [len(sequence) for sequence in sequences]
    longest = max(sizes)
    flat = torch.cat(list(sequences))
    padded = flat.new_full((len(sizes), longest, *flat.shape[1:]), padding_value)
    # row-major position of element j of sequence i in the padded tensor: i * longest + j
    lengths = torch.tensor(sizes)
    starts = torch.arange(len(sizes)) * longest - (torch.cumsum(lengths, 0) - lengths)
    positions = torch.arange(flat.shape[0]) + torch.repeat_interleave(starts, lengths)
    padded.view(-1, *flat.shape[1:])[send_without_waiting(positions, flat.device)] = flat
    return padded


def pad_in_one_copy(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def pad_sequence(
        sequences: Any, batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"
    ) -> Tensor:
        if batch_first and padding_side == "right" and isinstance(sequences, (list, tuple)) and len(sequences) > 1:
            return padded_in_one_copy(sequences, padding_value)
        return original(sequences, batch_first=batch_first, padding_value=padding_value, padding_side=padding_side)

    return pad_sequence


def padding_in_one_copy() -> AbstractContextManager[None]:
    """Within this block rfdetr's matcher pads targets in two operations (see the module's text)."""
    return patch_rfdetr("rfdetr.models.matcher", "pad_sequence", pad_in_one_copy)

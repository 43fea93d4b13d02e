"""The decoder's sine embedding of its reference boxes divides by frequencies computed once, not once per element.

rfdetr's `gen_sineembed_for_position` builds its 128 frequencies (`10000 ** (2 * (i // 2) / 128)`) from `arange` on
every call. Compiled, Inductor folds that into the element-wise kernels: every one of the embedding's numbers (128
images x 3,900 queries x 512 in training) evaluates a `pow` again, in the forward kernel and again in the backward's,
which makes them compute-bound where they would be limited by memory.

This replaces the function, in rfdetr's transformer module, with rfdetr's own steps dividing by a tensor of the
frequencies that the block computes once per device, with rfdetr's expression, before anything is compiled: the
compiled kernels read 128 numbers instead of evaluating them. The frequencies are the same numbers, so the embedding
is rfdetr's value for value. Calls with another dtype or width than those prepared go to rfdetr's function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

# rfdetr's decoders embed each coordinate in d_model // 2 = 128 numbers
WIDTH = 128


def frequencies(device: torch.device, dtype: torch.dtype = torch.float32, dim: int = WIDTH) -> Tensor:
    """rfdetr's frequencies, by its own expression."""
    dim_t = torch.arange(dim, dtype=dtype, device=device)
    return 10000 ** (2 * (dim_t // 2) / dim)


def sine_embedding(original: Callable[..., Tensor], prepared: dict[Any, Tensor]) -> Callable[..., Tensor]:
    def gen_sineembed_for_position(pos_tensor: Tensor, dim: int = 128) -> Tensor:
        dim_t = prepared.get((pos_tensor.device, pos_tensor.dtype, dim))
        if dim_t is None or pos_tensor.size(-1) not in (2, 4):
            return original(pos_tensor, dim)
        scale = 2 * math.pi

        def embedded(coordinate: int) -> Tensor:
            position = pos_tensor[:, :, coordinate] * scale
            position = position[:, :, None] / dim_t
            return torch.stack((position[:, :, 0::2].sin(), position[:, :, 1::2].cos()), dim=3).flatten(2)

        order = (1, 0) if pos_tensor.size(-1) == 2 else (1, 0, 2, 3)  # rfdetr's: y, x, then w, h
        return torch.cat([embedded(coordinate) for coordinate in order], dim=2)

    return gen_sineembed_for_position


@contextmanager
def sine_embedding_frequencies_once() -> Iterator[None]:
    """Within this block rfdetr's sine embedding divides by frequencies prepared for the CPU and every visible GPU
    (see the module's text)."""
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    prepared = {(device, torch.float32, WIDTH): frequencies(device) for device in devices}
    with patch_rfdetr(
        "rfdetr.models.transformer", "gen_sineembed_for_position", lambda original: sine_embedding(original, prepared)
    ):
        yield

"""The decoder's sine embedding of its reference boxes as one stack of sines and cosines, not four stacks joined.

rfdetr's `gen_sineembed_for_position` turns each reference box (x, y, w, h) into 4 x 128 values: for each
coordinate the sines of its even angles and the cosines of its odd ones, interleaved by a `stack`, and the four
coordinates' blocks joined by a `cat` (in the order y, x, w, h). Compiled, Inductor fuses the `cat` and the `stack`s
into one kernel over the output whose every value evaluates each input's expression and keeps one: a sine or
cosine for each branch. In a Nano training step at batch 128 that kernel writes 128 x 3,900 x 512 values.

Here the angles of all four coordinates are one tensor (the coordinates taken in rfdetr's order), and the output is
one `stack` of their sines and cosines: each value's expression has one sine and one cosine. An even angle and the
odd one after it are the same number (rfdetr's divisor is `10000 ** (2 * (i // 2) / dim)`), so the sines of the
even angles and the cosines of the odd ones are the sines and cosines of the even angles alone.

Guarantees: run eagerly, the same values bit for bit; gradients equal up to floating-point rounding (their sums are
taken in another order). Boxes with another number of coordinates than 2 or 4 go to rfdetr's function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

# rfdetr's block order: y, then x (then w, h)
COORDINATE_ORDER = {2: [1, 0], 4: [1, 0, 2, 3]}


def in_one_stack(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """rfdetr's `gen_sineembed_for_position` with the angles of every coordinate in one tensor and one stack of
    their sines and cosines."""

    def gen_sineembed_for_position(pos_tensor: Tensor, dim: int = 128) -> Tensor:
        order = COORDINATE_ORDER.get(pos_tensor.size(-1))
        if order is None:
            return original(pos_tensor, dim)
        # the divisors and angles as rfdetr computes them, so the values are the same numbers
        divisors = torch.arange(dim, dtype=pos_tensor.dtype, device=pos_tensor.device)
        divisors = 10000 ** (2 * (divisors // 2) / dim)
        angles = (pos_tensor[:, :, order] * (2 * math.pi))[..., None] / divisors[0::2]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(2)

    return gen_sineembed_for_position


def sine_embedding_in_one_stack() -> AbstractContextManager[None]:
    """Within this block rfdetr's decoder computes its reference boxes' sine embedding in one stack (see the
    module's text)."""
    return patch_rfdetr("rfdetr.models.transformer", "gen_sineembed_for_position", in_one_stack)

"""In training, the two-stage selection's batched group products add their bias in the kernel that reads their
output, instead of copying the bias into the output first.

rfdetr's `_batched_group_linear` computes each query group's affine map as one `torch.baddbmm(bias, x, weight.T)`
with the bias broadcast over the rows. `baddbmm` starts by copying that broadcast bias into its whole output, then
accumulates the product onto it: in a Nano training step at batch 128 it does so 7 times (the encoder output's
projection and the class head while ranking, then the projection, the class head and the box head's three layers
for the selected rows), a strided copy of about 1.5 GB a step. Here the product is a `torch.bmm` and the bias is
added after it; compiled, Inductor fuses that addition into the kernel that reads the product next (the LayerNorm,
the ReLU, the ranking's maximum).

Guarantees: the same values up to floating-point rounding (under bf16 the product is rounded before the bias is
added rather than after), so a near-tie in the ranking may select another position, as rfdetr's own batched
selection may against its per-group loop. Only the two-stage selection calls this function, and only in training.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def bias_added_after(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `_batched_group_linear` with the bias added to the product rather than copied into its output."""

    def _batched_group_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        rows = x.reshape(x.shape[0], -1, x.shape[-1])
        out = torch.bmm(rows, weight.transpose(1, 2)) + bias.unsqueeze(1)
        return out.reshape(*x.shape[:-1], weight.shape[-2])

    return _batched_group_linear


def group_products_without_bias_copy() -> AbstractContextManager[None]:
    """Within this block rfdetr's two-stage group products add their bias after the product (see the module's
    text)."""
    return patch_rfdetr("rfdetr.models.transformer", "_batched_group_linear", bias_added_after)

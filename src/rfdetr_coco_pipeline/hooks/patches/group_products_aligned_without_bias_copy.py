"""In training, the two-stage selection's batched group products add their bias in the kernel that reads their
output, instead of copying the bias into the output first, and compute a multiple of 8 outputs.

rfdetr's `_batched_group_linear` computes each query group's affine map as one `torch.baddbmm(bias, x, weight.T)`
with the bias broadcast over the rows. `baddbmm` starts by copying that broadcast bias into its whole output, then
accumulates the product onto it: in a Nano training step at batch 128 it does so 7 times (the encoder output's
projection and the class head while ranking, then the projection, the class head and the box head's three layers
for the selected rows), a strided copy as large as each output. Here the product is a `torch.bmm` and the bias is
added after it; compiled, Inductor fuses that addition into the kernel that reads the product next (the LayerNorm,
the ReLU, the ranking's maximum).

The class head has 91 outputs and the box head's last layer 4: products with such a dimension (forward, and both
products backward) cannot use the GPU's aligned matrix kernels. Here the weight gets zero rows up to a multiple of 8
outputs (96 and 8) and the product's extra columns are left out before the bias is added: the same sums, and zero
gradients for the rows that were added.

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
from torch.nn import functional as F

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def aligned_and_bias_after(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `_batched_group_linear` with a multiple of 8 outputs computed and the bias added to the product
    rather than copied into its output."""

    def _batched_group_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        rows = x.reshape(x.shape[0], -1, x.shape[-1])
        outputs = weight.shape[-2]
        aligned = F.pad(weight, (0, 0, 0, -outputs % 8))  # zero rows: outputs that are left out below
        product = torch.bmm(rows, aligned.transpose(1, 2))[..., :outputs]
        # in the product's dtype, as autocast's baddbmm adds it: a float32 bias would promote the sum to float32
        out = product + bias.to(product.dtype).unsqueeze(1)
        return out.reshape(*x.shape[:-1], outputs)

    return _batched_group_linear


def group_products_aligned_without_bias_copy() -> AbstractContextManager[None]:
    """Within this block rfdetr's two-stage group products compute a multiple of 8 outputs and add their bias after
    the product (see the module's text)."""
    return patch_rfdetr("rfdetr.models.transformer", "_batched_group_linear", aligned_and_bias_after)

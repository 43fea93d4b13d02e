"""In training, the backbone's patch embedding runs as one matrix product over the images' patches, not as a
convolution.

rfdetr's backbone embeds each 16 x 16 patch of the image with a convolution whose kernel and stride are the patch
size (`Dinov2WithRegistersPatchEmbeddings.projection`). On CUDA, cuDNN pads the three colour channels to eight in a
channels-last copy of the whole batch and runs a convolution kernel made for overlapping windows, forward and for
the weight's gradient. The patches do not overlap, so the convolution is a product: each output is the bias plus
the sum over the patch's 3 x 16 x 16 pixels of pixel times weight. Here the images are laid out as rows of patches
(one copy, which Inductor fuses with the cast to the autocast dtype) and multiplied by the kernel viewed as a
(width, 768) matrix; the embeddings come out in the (batch, patches, width) layout rfdetr's next steps want, where
the convolution's output is transposed.

Guarantees: the embeddings and the kernel's and bias's gradients are rfdetr's up to floating-point rounding (the
same products, summed in another order). It applies to a plain `nn.Conv2d` whose kernel equals its stride, without
padding, dilation or groups, on images whose sides are multiples of the patch; any other call, and every call
outside training (evaluation, export), is rfdetr's own.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

PATCH_EMBEDDINGS = "rfdetr.models.backbone.dinov2_with_windowed_attn:Dinov2WithRegistersPatchEmbeddings"


def patches_as_rows(pixels: Tensor, patch: tuple[int, int]) -> Tensor:
    """`pixels` (batch, channels, height, width) as (batch, patches, channels x patch height x patch width): one row
    per patch in the convolution's output order (row by row), its values in the kernel's (channel, y, x) order."""
    batch, channels, height, width = pixels.shape
    rows, columns = height // patch[0], width // patch[1]
    grid = pixels.reshape(batch, channels, rows, patch[0], columns, patch[1])
    return grid.permute(0, 2, 4, 1, 3, 5).reshape(batch, rows * columns, channels * patch[0] * patch[1])


def _is_patchwise(conv: nn.Module, pixels: Tensor) -> bool:
    return (
        type(conv) is nn.Conv2d
        and conv.kernel_size == conv.stride
        and conv.padding == (0, 0)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and pixels.dim() == 4
        and pixels.shape[1] == conv.in_channels
        and pixels.shape[2] % conv.kernel_size[0] == 0
        and pixels.shape[3] % conv.kernel_size[1] == 0
    )


def embeddings_as_product(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `Dinov2WithRegistersPatchEmbeddings.forward` with the patchwise convolution as a matrix product in
    training; otherwise `original`."""

    def forward(self: Any, pixel_values: Tensor) -> Tensor:
        conv = self.projection
        if not (self.training and _is_patchwise(conv, pixel_values)):
            return original(self, pixel_values)
        rows = patches_as_rows(pixel_values, conv.kernel_size)
        return F.linear(rows, conv.weight.reshape(conv.out_channels, -1), conv.bias)

    return forward


def patch_embedding_as_product() -> AbstractContextManager[None]:
    """Within this block rfdetr's backbone embeds the training images' patches with one matrix product (see the
    module's text)."""
    return patch_rfdetr(PATCH_EMBEDDINGS, "forward", embeddings_as_product)

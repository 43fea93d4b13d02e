"""The decoder's feed-forward block in training with the ReLU's backward and the first bias's gradient inside the
backward pass's first product, one Triton kernel on CUDA (`decoder_layer` says how, and what it guarantees)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from rfdetr_coco_pipeline.hooks.patches.decoder_layer import RELU_BACKWARD_IN_PRODUCT, lean_part


def decoder_relu_backward_in_the_product() -> AbstractContextManager[None]:
    """Within this block rfdetr's decoder layers compute their feed-forward block with `FeedForwardReLU` (see
    `decoder_layer`): the forward of `decoder_relu_in_the_product`, and a backward whose first product zeroes the
    ReLU's gradient and sums the bias's as it writes."""
    return lean_part(RELU_BACKWARD_IN_PRODUCT)

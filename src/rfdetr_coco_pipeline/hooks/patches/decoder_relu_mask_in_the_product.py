"""The decoder's feed-forward block in training with ReLU's backward mask applied in the Triton product that makes
the gradient it masks (`decoder_layer` says how, and what it guarantees)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from rfdetr_coco_pipeline.hooks.patches.decoder_layer import RELU_MASK_IN_PRODUCT, lean_part


def decoder_relu_mask_in_the_product() -> AbstractContextManager[None]:
    """Within this block rfdetr's decoder layers, where `decoder_relu_in_the_product` is on too, make the hidden
    activation's gradient masked in one Triton product (see `decoder_layer`)."""
    return lean_part(RELU_MASK_IN_PRODUCT)

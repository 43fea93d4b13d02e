"""The decoder's feed-forward block in training with its first product's bias and ReLU in cuBLASLt's epilogue
(`decoder_layer` says how, and what it guarantees)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from rfdetr_coco_pipeline.hooks.patches.decoder_layer import RELU_IN_PRODUCT, lean_part


def decoder_relu_in_the_product() -> AbstractContextManager[None]:
    """Within this block rfdetr's decoder layers add the first feed-forward product's bias and apply its ReLU in the
    product itself (see `decoder_layer`)."""
    return lean_part(RELU_IN_PRODUCT)

"""The decoder's grouped self-attention in training on views of the queries, without regrouping copies
(`decoder_layer` says how, and what it guarantees)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from rfdetr_coco_pipeline.hooks.patches.decoder_layer import VIEWS, lean_part


def decoder_attention_on_views() -> AbstractContextManager[None]:
    """Within this block rfdetr's decoder layers attend within their query groups on views (see `decoder_layer`)."""
    return lean_part(VIEWS)

"""The compiled model as one graph: the backbone's position embeddings no longer stop it.

rfdetr's windowed DINOv2 embeddings wrap `interpolate_pos_encoding` in `torch.compiler.disable`. torch.compile
stops its graph at that call and at every call around it, so RF-DETR Nano compiles as six graphs with five breaks.
Every tensor that crosses from one graph to the next is made whole in memory, forward and backward: the backbone's
four feature maps, for one, get their gradients as channel slices of the projector's input gradient, and each is
copied to contiguous memory before the backbone's backward can start.

The method interpolates only when the image's patch grid differs from the position table's; otherwise (square
images of the table's size, as the recipe trains) it returns the table itself. This replaces it with a method that
returns the table in that case, inside the graph, and calls rfdetr's own (still kept out of the graph) in every
other case. Guarantees: rfdetr's values; the same tensor is added to the patches.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

EMBEDDINGS = "rfdetr.models.backbone.dinov2_with_windowed_attn:WindowedDinov2WithRegistersEmbeddings"


def table_inside_the_graph(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """rfdetr's `interpolate_pos_encoding` with its no-interpolation case traceable by torch.compile."""

    def interpolate_pos_encoding(self: Any, embeddings: Tensor, height: int, width: int) -> Tensor:
        # rfdetr's own test for returning the table unchanged
        unchanged = embeddings.shape[1] == self.position_embeddings.shape[1] and height == width
        if unchanged and not torch.jit.is_tracing():
            return self.position_embeddings
        return original(self, embeddings, height, width)

    return interpolate_pos_encoding


def model_in_one_graph() -> AbstractContextManager[None]:
    """Within this block the backbone's position embeddings stay inside a compiled graph (see the module's text)."""
    return patch_rfdetr(EMBEDDINGS, "interpolate_pos_encoding", table_inside_the_graph)

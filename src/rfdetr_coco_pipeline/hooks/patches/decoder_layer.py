"""rfdetr's decoder layer in training with fewer copies: the forward that the speedups `decoder_attention_on_views`
and `decoder_relu_in_the_product` put in place of `TransformerDecoderLayer.forward_post`, each turning on its part.

In training, each of Nano's two decoder layers runs 3,900 queries (13 groups of 300 that attend only within their
group) through self-attention, deformable cross-attention and a 2,048-wide ReLU feed-forward block.

- **Self-attention on views** (`grouped_self_attention`). rfdetr regroups the queries into (13 x batch, 300, 256)
  with `split` and `cat`, and `nn.MultiheadAttention` transposes them to sequence-first, projects them, moves the
  heads around the attention kernel and transposes back; the output is regrouped again. Here the projections of all
  3,900 queries are viewed as (batch x 13, heads, 300, head width) and handed to `scaled_dot_product_attention` as
  they are, with the same parameters: queries and keys in one matrix product (they are the same tensor).
- **ReLU in the product** (`LinearReLU`). The first feed-forward product writes a (batch x 3,900, 2,048) activation
  (2 GB in bf16 at batch 128) that a second kernel reads to add the bias and apply the ReLU. Here one call of
  `torch._addmm_activation` (cuBLASLt's bias-and-ReLU epilogue on CUDA) writes it once, with its own backward, in
  which the bias's gradient (the column sums of the masked incoming gradient, another 2 GB read) comes out of the
  weight's gradient product: the product's other input gets a column of ones.
- **ReLU's mask in the product** (`feed_forward_products.FeedForwardReLU`, on top of the part above). Backward, the
  gradient of the hidden activation, (batch x 3,900, 2,048), comes masked out of one Triton product instead of a
  cuBLAS product and a mask pass (`feed_forward_products` says how). It needs the layer's feed-forward dropout off
  (rfdetr's default).

Everything else is rfdetr's layer as written. The lean forward covers the training call of a plain layer (no
attention masks, no keypoints, `nn.MultiheadAttention` and `nn.Linear` as rfdetr builds them, ReLU, queries a
multiple of the groups); any other call, and every call in evaluation, goes to rfdetr's `forward_post`.

Guarantees: the layer's output and every gradient equal rfdetr's up to floating-point rounding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfdetr_coco_pipeline.hooks.patches.feed_forward_products import (
    in_autocast_dtype,
    relu_feed_forward,
    weight_and_bias_gradients,
)
from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, triton_kernels_run_on

LAYER = "rfdetr.models.transformer:TransformerDecoderLayer"
VIEWS, RELU_IN_PRODUCT, RELU_MASK_IN_PRODUCT = "views", "relu_in_product", "relu_mask_in_product"

_parts_on: Counter[str] = Counter()  # the lean parts turned on by the blocks now entered, nested blocks counted


@contextmanager
def lean_part(part: str) -> Iterator[None]:
    """Within this block the decoder layer's `part` (VIEWS or RELU_IN_PRODUCT) runs the lean way. The first block
    entered puts the lean forward in place; rfdetr's is back when the last one leaves, also after an error."""
    with patch_rfdetr(LAYER, "forward_post", lean_forward_post) if not _parts_on else nullcontext():
        _parts_on[part] += 1
        try:
            yield
        finally:
            _parts_on[part] -= 1
            if not _parts_on[part]:
                del _parts_on[part]


def grouped_self_attention(attention: nn.MultiheadAttention, tgt: Tensor, query_pos: Tensor, groups: int) -> Tensor:
    """What rfdetr's layer gets from regrouping `tgt` (batch, queries, width) into `groups`, attending with
    `attention` (queries and keys `tgt + query_pos`, values `tgt`) and regrouping back, computed on views."""
    batch, queries, width = tgt.shape
    heads, per_group = attention.num_heads, queries // groups
    weight, bias = attention.in_proj_weight, attention.in_proj_bias
    query_key = F.linear(tgt + query_pos, weight[: 2 * width], bias[: 2 * width])
    query_key = query_key.view(batch, groups, per_group, 2, heads, -1).permute(3, 0, 1, 4, 2, 5)
    q, k = query_key.reshape(2, batch * groups, heads, per_group, -1).unbind(0)
    v = F.linear(tgt, weight[2 * width :], bias[2 * width :]).view(batch, groups, per_group, heads, -1)
    v = v.permute(0, 1, 3, 2, 4).reshape(batch * groups, heads, per_group, -1)
    dropout = attention.dropout if attention.training else 0.0
    attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    attended = attended.view(batch, groups, heads, per_group, -1).permute(0, 1, 3, 2, 4).reshape(batch, queries, width)
    # the output projection's parameters as nn.MultiheadAttention uses them: not through the module, which a
    # precision plugin may have converted (Transformer Engine's FP8 layers on the FP8 route)
    return F.linear(attended, attention.out_proj.weight, attention.out_proj.bias)


class LinearReLU(torch.autograd.Function):
    """relu(x @ weight.T + bias) for 2-D `x`, forward in one `torch._addmm_activation` call; the backward masks the
    incoming gradient where the output is zero, as ReLU's backward does, and computes the weight's and the bias's
    gradients in one product."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        out = torch._addmm_activation(bias, x, weight.t())
        ctx.save_for_backward(x, weight, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, weight, out = ctx.saved_tensors
        grad = grad * (out > 0)
        return grad @ weight, *weight_and_bias_gradients(grad, x)


def linear_relu(linear: nn.Linear, x: Tensor, function: type[LinearReLU] = LinearReLU) -> Tensor:
    """relu(linear(x)) through `function` (`LinearReLU`, or a variant of its backward to compare it with); under
    autocast the inputs are cast as autocast casts a linear layer's."""
    return in_autocast_dtype(function, x, linear.weight, linear.bias)


def _plain_attention(attention: nn.Module) -> bool:
    return (
        type(attention) is nn.MultiheadAttention
        and attention.batch_first
        and attention._qkv_same_embed_dim
        and attention.in_proj_bias is not None
        and attention.bias_k is None
        and not attention.add_zero_attn
    )


def _has_relu_feed_forward(layer: nn.Module) -> bool:
    return layer.activation is F.relu and type(layer.linear1) is nn.Linear and layer.linear1.bias is not None


def _mask_in_product(layer: nn.Module, tgt: Tensor) -> bool:
    return (
        RELU_MASK_IN_PRODUCT in _parts_on
        and type(layer.linear2) is nn.Linear
        and layer.linear2.bias is not None
        and layer.dropout.p == 0
        and triton_kernels_run_on(tgt)
    )


def lean_forward_post(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward_post(
        self: Any,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        query_pos: Tensor | None = None,
        reference_points: Tensor | None = None,
        spatial_shapes: Tensor | None = None,
        spatial_shapes_hw: list[tuple[int, int]] | None = None,
        level_start_index: Tensor | None = None,
        **keypoints: Any,
    ) -> Any:
        lean = (
            self.training
            and tgt_mask is None
            and tgt_key_padding_mask is None
            and query_pos is not None
            and not self.enable_keypoint_processing
            and tgt.shape[1] % self.group_detr == 0
        )
        if not lean:
            return original(
                self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, query_pos,
                reference_points, spatial_shapes, spatial_shapes_hw, level_start_index, **keypoints,
            )  # fmt: skip
        batch, queries, _ = tgt.shape
        if VIEWS in _parts_on and _plain_attention(self.self_attn):
            tgt2 = grouped_self_attention(self.self_attn, tgt, query_pos, self.group_detr)
        else:  # rfdetr's regrouping
            q = torch.cat((tgt + query_pos).split(queries // self.group_detr, dim=1), dim=0)
            v = torch.cat(tgt.split(queries // self.group_detr, dim=1), dim=0)
            tgt2 = self.self_attn(q, q, v, need_weights=False)[0]
            tgt2 = torch.cat(tgt2.split(batch, dim=0), dim=1)
        tgt = self.norm1(tgt + self.dropout1(tgt2))
        tgt2 = self.cross_attn(
            tgt + query_pos,
            reference_points,
            memory,
            spatial_shapes,
            level_start_index,
            memory_key_padding_mask,
            input_spatial_shapes_hw=spatial_shapes_hw,
        )
        tgt = self.norm2(tgt + self.dropout2(tgt2))
        if RELU_IN_PRODUCT in _parts_on and _has_relu_feed_forward(self):
            if _mask_in_product(self, tgt):
                tgt2 = relu_feed_forward(self.linear1, self.linear2, tgt)
            else:
                tgt2 = self.linear2(self.dropout(linear_relu(self.linear1, tgt)))
        else:
            tgt2 = self.linear2(self.dropout(self.activation(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout3(tgt2))

    return forward_post

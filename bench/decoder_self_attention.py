"""The decoder's grouped self-attention three ways, timed side by side: rfdetr's, and two that compute the same
function with fewer copies.

usage: python -m bench.decoder_self_attention [--batch 128] [--repeats 20] [--warmup 3] [--no-compile] [--out FILE.json]

In training, rfdetr's decoder layer splits its 3,900 queries into 13 groups of 300 that attend only within their
group: it adds the query positions, regroups the (batch, 3,900, 256) queries and values into (13 x batch, 300, 256)
with `split` and `cat`, calls `nn.MultiheadAttention` (8 heads of 32, batch first), and regroups the output back.
`nn.MultiheadAttention` itself transposes its inputs to sequence-first, projects queries, keys and values with three
matrix products (the queries are the keys, but the values differ), and moves the heads around the attention kernel.

- `rfdetr`: that block as rfdetr's layer runs it (`rfdetr_block`).
- `lean_module`: the same block with `GroupedSelfAttention` in place of `nn.MultiheadAttention`: the same parameters,
  queries and keys projected in one matrix product, heads as views for `scaled_dot_product_attention`, no transposes.
  It only swaps the module's class, so it could be applied to rfdetr's layer as it is.
- `grouped_views`: no regrouping copies either: the groups and heads are views of the (batch, 3,900, ...)
  projections (`grouped_views_block`); the registry's `decoder_attention_on_views`.

Each is compiled on its own (torch.compile, static shapes, unless --no-compile) and run forward under bf16 autocast
and backward, on random queries and positions; figures are GPU-busy ms per training step (two decoder layers),
as in bench.block_timing. All three give the same values and gradients up to rounding
(tests/test_bench.py checks that against rfdetr's own layer on the CPU).
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.block_timing import Timer, side_by_side, side_by_side_main
from rfdetr_coco_pipeline.hooks.patches.decoder_layer import grouped_self_attention

GROUPS, QUERIES_PER_GROUP, WIDTH, HEADS = 13, 300, 256, 8  # rfdetr Nano in training
LAYERS = 2


class GroupedSelfAttention(nn.MultiheadAttention):
    """`nn.MultiheadAttention` with the same parameters and results, computed without its transposes when called as
    rfdetr's decoder calls it (batch first, the query tensor also the key, no masks, no attention weights wanted):
    queries and keys come from one matrix product, the heads are views handed to `scaled_dot_product_attention`.
    Any other call goes to `nn.MultiheadAttention.forward`."""

    def forward(  # type: ignore[override]
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        lean = (
            query is key
            and self.batch_first
            and self._qkv_same_embed_dim
            and self.in_proj_bias is not None
            and self.bias_k is None
            and not self.add_zero_attn
            and not need_weights
            and attn_mask is None
            and key_padding_mask is None
            and not is_causal
        )
        if not lean:
            return super().forward(
                query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal
            )
        width, heads = self.embed_dim, self.num_heads
        batch, length, _ = query.shape
        weight, bias = self.in_proj_weight, self.in_proj_bias
        query_key = F.linear(query, weight[: 2 * width], bias[: 2 * width]).view(batch, length, 2, heads, -1)
        q, k = query_key.permute(2, 0, 3, 1, 4).unbind(0)
        v = F.linear(value, weight[2 * width :], bias[2 * width :]).view(batch, length, heads, -1).transpose(1, 2)
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        return self.out_proj(attended.transpose(1, 2).reshape(batch, length, width)), None


def rfdetr_block(attention: nn.MultiheadAttention, tgt: Tensor, query_pos: Tensor) -> Tensor:
    """The self-attention of rfdetr 1.11.2's `TransformerDecoderLayer.forward_post` in training, up to the residual:
    positions added, queries regrouped into (groups x batch, 300, width), attention, regrouped back."""
    batch, queries, _ = tgt.shape
    q = k = tgt + query_pos
    q = torch.cat(q.split(queries // GROUPS, dim=1), dim=0)
    k = q
    v = torch.cat(tgt.split(queries // GROUPS, dim=1), dim=0)
    out = attention(q, k, v, need_weights=False)[0]
    return torch.cat(out.split(batch, dim=0), dim=1)


def grouped_views_block(attention: nn.MultiheadAttention, tgt: Tensor, query_pos: Tensor) -> Tensor:
    """`rfdetr_block`'s values without regrouping copies: the registry's `decoder_attention_on_views`
    (`grouped_self_attention`)."""
    return grouped_self_attention(attention, tgt, query_pos, GROUPS)


def lean_copy(attention: nn.MultiheadAttention) -> GroupedSelfAttention:
    """A `GroupedSelfAttention` sharing `attention`'s parameters."""
    lean = copy.copy(attention)
    lean.__class__ = GroupedSelfAttention
    return lean  # type: ignore[return-value]


def measure(batch: int, repeats: int, warmup: int, compile_blocks: bool) -> dict[str, Any]:
    """GPU-busy (CPU: wall) ms per training step of each variant, forward and backward, for the decoder's layers."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(WIDTH, HEADS, dropout=0.0, batch_first=True).to(device).train()
    shape = (batch, GROUPS * QUERIES_PER_GROUP, WIDTH)
    inputs = (
        torch.randn(shape, device=device, requires_grad=True),
        torch.randn(shape, device=device, requires_grad=True),
    )
    blocks = {
        "rfdetr": partial(rfdetr_block, attention),
        "lean_module": partial(rfdetr_block, lean_copy(attention)),
        "grouped_views": partial(grouped_views_block, attention),
    }
    timer = Timer(device, repeats, warmup)
    result = side_by_side(blocks, inputs, list(attention.parameters()), timer, compile_blocks, LAYERS)
    return {"batch": batch, **result}


if __name__ == "__main__":
    side_by_side_main(__doc__, measure)

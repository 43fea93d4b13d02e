"""The backbone's self-attention two ways, timed side by side: rfdetr's, and one with queries, keys and values in one
matrix product and the heads as views.

usage: python -m bench.backbone_attention [--batch 128] [--repeats 20] [--warmup 3] [--no-compile] [--out FILE.json]

rfdetr Nano's backbone is 12 DINOv2 blocks, 384 wide with 6 heads of 64: nine attend within each of an image's four
windows (4 x batch sequences of 145 tokens), three over the whole image (batch sequences of 580). rfdetr's
attention (`Dinov2WithRegistersSdpaAttention`) projects queries, keys and values with three 384-wide matrix products,
moves the heads in front of the tokens for `scaled_dot_product_attention`, makes its output contiguous again and
applies the output projection.

- `rfdetr`: that module as rfdetr's block calls it.
- `fused_qkv`: the same parameters, the three projections as one 1,152-wide product (the weights concatenated each
  call) whose output is viewed as (batch, heads, tokens, 64) for queries, keys and values; the attention's output
  goes to the output projection as a view (`fused_qkv_block`).

Each is compiled on its own (torch.compile, static shapes, unless --no-compile) and run forward under bf16 autocast
and backward on random tokens, at both shapes; a step's figure is nine windowed calls plus three whole-image calls,
GPU-busy ms as in bench.block_timing. Both give the same values and gradients up to rounding (tests/test_bench.py
checks that against rfdetr's own module on the CPU).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.block_timing import Timer, side_by_side, side_by_side_main

WIDTH, HEADS, WINDOWS, TOKENS_PER_WINDOW = 384, 6, 4, 145  # rfdetr Nano at 384 px: 12 x 12 patches + a class token
WINDOWED_BLOCKS, WHOLE_IMAGE_BLOCKS = 9, 3


def nano_attention() -> nn.Module:
    """rfdetr's backbone attention module with Nano's sizes and random weights."""
    from rfdetr.models.backbone.dinov2_with_windowed_attn import (
        Dinov2WithRegistersSdpaAttention,
        WindowedDinov2WithRegistersConfig,
    )

    config = WindowedDinov2WithRegistersConfig(hidden_size=WIDTH, num_attention_heads=HEADS)
    return Dinov2WithRegistersSdpaAttention(config)


def rfdetr_block(attention: nn.Module, hidden: Tensor) -> Tensor:
    """rfdetr's attention module as its block calls it."""
    return attention(hidden)[0]


def fused_qkv_block(attention: nn.Module, hidden: Tensor) -> Tensor:
    """`rfdetr_block`'s values with one projection product and the heads as views."""
    inner, dense = attention.attention, attention.output.dense
    batch, tokens, width = hidden.shape
    heads = inner.num_attention_heads
    weight = torch.cat((inner.query.weight, inner.key.weight, inner.value.weight))
    bias = torch.cat((inner.query.bias, inner.key.bias, inner.value.bias))
    q, k, v = F.linear(hidden, weight, bias).view(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    dropout = inner.attention_probs_dropout_prob if inner.training else 0.0
    attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    return F.linear(attended.transpose(1, 2).reshape(batch, tokens, width), dense.weight, dense.bias)


BLOCKS = {"rfdetr": rfdetr_block, "fused_qkv": fused_qkv_block}


def measure(batch: int, repeats: int, warmup: int, compile_blocks: bool) -> dict[str, Any]:
    """GPU-busy (CPU: wall) ms per training step of each variant, forward and backward, over the backbone's blocks."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    attention = nano_attention().to(device).train()
    timer = Timer(device, repeats, warmup)
    blocks = {name: (lambda hidden, block=block: block(attention, hidden)) for name, block in BLOCKS.items()}
    shapes = {
        "windowed": ((WINDOWS * batch, TOKENS_PER_WINDOW, WIDTH), WINDOWED_BLOCKS),
        "whole_image": ((batch, WINDOWS * TOKENS_PER_WINDOW, WIDTH), WHOLE_IMAGE_BLOCKS),
    }
    result: dict[str, Any] = {"batch": batch, "by_shape": {}}
    for shape_name, (shape, calls) in shapes.items():
        hidden = torch.randn(shape, device=device, requires_grad=True)
        result["by_shape"][shape_name] = side_by_side(
            blocks, (hidden,), list(attention.parameters()), timer, compile_blocks, calls
        )
    result["ms_per_step"] = {
        name: round(sum(part["ms_per_step"][name] for part in result["by_shape"].values()), 3) for name in BLOCKS
    }
    first = result["ms_per_step"]["rfdetr"]
    for name, ms in result["ms_per_step"].items():
        print(f"{ms:9.3f} ms per step  {first / ms:5.2f}x  {name}, the 12 blocks")
    return result


if __name__ == "__main__":
    side_by_side_main(__doc__, measure)

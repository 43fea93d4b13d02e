"""The decoder's feed-forward block three ways (four on a GPU), timed side by side: rfdetr's, and those whose first
matrix product adds the bias and applies the ReLU in cuBLASLt's epilogue, with the bias's gradient summed apart or
from the weight's gradient product, and (on a GPU) with ReLU's backward mask in the Triton product too.

usage: python -m bench.decoder_ffn [--batch 128] [--repeats 20] [--warmup 3] [--no-compile] [--out FILE.json]

In training, each of rfdetr Nano's two decoder layers ends with `norm3(tgt + linear2(relu(linear1(tgt))))` over
(batch, 3,900, 256) queries, 2,048 wide inside: at batch 128 the hidden activation is 499,200 x 2,048, 2 GB in
bf16. Compiled, the first product writes it before the bias and ReLU, and a fused element-wise kernel reads it and
writes it again.

- `rfdetr`: the block as rfdetr's layer computes it (`rfdetr_block`).
- `relu_epilogue_bias_summed`: the first product, its bias and the ReLU in one call of `torch._addmm_activation`
  (cuBLASLt's bias-and-ReLU epilogue on CUDA; the hidden activation is written once), with its own backward, which
  sums the masked gradient's columns for the bias's gradient (`BiasGradientSummed`).
- `relu_epilogue`: the same forward, and a backward whose weight-gradient product gives the bias's gradient too (its
  other input has a column of ones): the registry's `decoder_relu_in_the_product` (`LinearReLU`).
- `relu_mask_in_product` (on a GPU): the same, and backward the hidden activation's gradient made masked in one
  Triton product: the registry's `decoder_relu_mask_in_the_product` with it (`feed_forward_products.FeedForwardReLU`).

Each is compiled on its own (torch.compile, static shapes, unless --no-compile), run forward under bf16 autocast and
backward, on random queries; figures are GPU-busy ms per training step (both decoder layers), as in
bench.block_timing. Both give the same values and gradients up to rounding (tests/test_bench.py checks that against
rfdetr's own layer on the CPU).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.block_timing import Timer, side_by_side, side_by_side_main
from rfdetr_coco_pipeline.hooks.patches.decoder_layer import LinearReLU, linear_relu
from rfdetr_coco_pipeline.hooks.patches.feed_forward_products import relu_feed_forward

QUERIES, WIDTH, HIDDEN, LAYERS = 3900, 256, 2048, 2  # rfdetr Nano in training


def rfdetr_block(layer: nn.Module, tgt: Tensor) -> Tensor:
    """The feed-forward block of rfdetr 1.11.2's `TransformerDecoderLayer.forward_post`: FFN, residual, norm3."""
    return layer.norm3(tgt + layer.linear2(layer.dropout(layer.activation(layer.linear1(tgt)))))


class BiasGradientSummed(LinearReLU):
    """`LinearReLU` with the bias's gradient summed from the masked gradient's columns, a pass of its own."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, weight, out = ctx.saved_tensors
        grad = grad * (out > 0)
        return grad @ weight, grad.t() @ x, grad.sum(0)


def relu_epilogue_bias_summed_block(layer: nn.Module, tgt: Tensor) -> Tensor:
    """`relu_epilogue_block` with the bias's gradient summed apart (`BiasGradientSummed`)."""
    return layer.norm3(tgt + layer.linear2(layer.dropout(linear_relu(layer.linear1, tgt, BiasGradientSummed))))


def relu_epilogue_block(layer: nn.Module, tgt: Tensor) -> Tensor:
    """`rfdetr_block` with the first product, its bias and the ReLU in one call: the registry's
    `decoder_relu_in_the_product` (`linear_relu`)."""
    return layer.norm3(tgt + layer.linear2(layer.dropout(linear_relu(layer.linear1, tgt))))


def relu_mask_in_product_block(layer: nn.Module, tgt: Tensor) -> Tensor:
    """`relu_epilogue_block` with both products in `FeedForwardReLU`: backward, ReLU's mask in the Triton product
    that makes the hidden activation's gradient (on CUDA, or under Triton's interpreter)."""
    return layer.norm3(tgt + relu_feed_forward(layer.linear1, layer.linear2, tgt))


class FeedForward(nn.Module):
    """The parameters of a decoder layer's feed-forward block, with rfdetr's names, for timing without rfdetr."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)
        self.dropout, self.norm3 = nn.Dropout(0.0), nn.LayerNorm(WIDTH)
        self.activation = F.relu


BLOCKS = {
    "rfdetr": rfdetr_block,
    "relu_epilogue_bias_summed": relu_epilogue_bias_summed_block,
    "relu_epilogue": relu_epilogue_block,
}


def measure(batch: int, repeats: int, warmup: int, compile_blocks: bool) -> dict[str, Any]:
    """GPU-busy (CPU: wall) ms per training step of each block, forward and backward, for the decoder's layers."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    layer = FeedForward().to(device).train()
    tgt = torch.randn(batch, QUERIES, WIDTH, device=device, requires_grad=True)
    on_gpu = {"relu_mask_in_product": relu_mask_in_product_block} if device.type == "cuda" else {}
    blocks = {name: partial(block, layer) for name, block in {**BLOCKS, **on_gpu}.items()}
    timer = Timer(device, repeats, warmup)
    return {"batch": batch, **side_by_side(blocks, (tgt,), list(layer.parameters()), timer, compile_blocks, LAYERS)}


if __name__ == "__main__":
    side_by_side_main(__doc__, measure)

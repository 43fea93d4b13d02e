"""The decoder's feed-forward block, linear2(relu(linear1(x))), whose backward applies ReLU's mask in the Triton
product that makes the hidden activation's gradient (`activation_grad_product_kernels`), and the pieces that the
decoder layer's ReLU products share with it.

Backward, the hidden activation's gradient is the second product's input gradient: (rows, hidden width), 2 GB in
bf16 for the decoder's 3,900 queries at batch 128. cuBLAS writes it and a second kernel reads it again, with the
activation, to apply ReLU's mask. Here one autograd function (`FeedForwardReLU`) holds both products and its
backward makes that gradient in one Triton kernel that applies the mask to each tile as it writes it. The first
product's weight and bias gradients come out of one product (`weight_and_bias_gradients`). The kernel runs on CUDA,
or on the CPU under Triton's interpreter (`TRITON_INTERPRET=1`, the tests).

Guarantees: the block's output is the one torch computes from the same products, and every gradient equals torch's
up to floating-point rounding (the hidden gradient is not rounded to the activation's dtype before the mask applies).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

# a 128 x 128 tile of the hidden gradient a program, 64 of the inner dimension at a time, on 8 warps; the saved
# activation's tile read after the product
TILE_M, TILE_N, TILE_K, GROUP_M, WARPS, STAGES, SAVED_FIRST = 128, 128, 64, 8, 8, 3, False


def weight_and_bias_gradients(grad: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of a product's weight and bias given its output's gradient `grad` and its input `x` (both 2-D),
    from one product: x gets a column of ones (the bias's gradient) and zeros to a multiple of 8 columns, for
    aligned products."""
    rows, width = x.shape
    x_and_ones = torch.cat([x, x.new_ones(rows, 1), x.new_zeros(rows, -(width + 1) % 8)], dim=1)
    weight_and_bias = grad.t() @ x_and_ones
    return weight_and_bias[:, :width], weight_and_bias[:, width]


def in_autocast_dtype(function: Any, x: Tensor, *parameters: Tensor) -> Tensor:
    """`function.apply` on `x` flattened to 2-D and `parameters`, each cast as autocast casts a linear layer's inputs
    (where autocast is on), with autocast off inside; the output has x's leading dimensions."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    with torch.autocast(device, enabled=False):
        flat = x.reshape(-1, x.shape[-1]).to(dtype)
        out = function.apply(flat, *(parameter.to(dtype) for parameter in parameters))
    return out.view(*x.shape[:-1], -1)


def masked_product(a: Tensor, b: Tensor, saved: Tensor) -> Tensor:
    """(a @ b) with ReLU's backward applied (zero where saved <= 0), in a's dtype, for 2-D a (M, K), b (K, N) and
    saved (M, N), in one Triton kernel."""
    from rfdetr_coco_pipeline.hooks.patches.activation_grad_product_kernels import activation_grad_product_kernel

    a, b, saved = a.contiguous(), b.contiguous(), saved.contiguous()  # the kernel reads rows of each
    (rows, inner), columns = a.shape, b.shape[1]
    result = a.new_empty((rows, columns))
    tiles = -(-rows // TILE_M) * -(-columns // TILE_N)
    activation_grad_product_kernel[(tiles,)](
        a, b, saved, result, rows, columns, inner,
        BLOCK_M=TILE_M, BLOCK_N=TILE_N, BLOCK_K=TILE_K, GROUP_M=GROUP_M,
        # float32 products as torch computes them by default (no TF32)
        INPUT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        SAVED_FIRST=SAVED_FIRST, num_warps=WARPS, num_stages=STAGES,
    )  # fmt: skip
    return result


# custom ops, so that torch.compile keeps the kernel in the compiled graph and CUDA graphs can record it
@torch.library.custom_op("rfdetr_pipeline::relu_masked_product", mutates_args=())
def relu_masked_product(a: Tensor, b: Tensor, relu_out: Tensor) -> Tensor:
    """(a @ b) where relu_out > 0, else 0, in a's dtype (`masked_product`)."""
    return masked_product(a, b, relu_out)


@relu_masked_product.register_fake
def _(a, b, saved):  # noqa: ANN001, ANN202
    return a.new_empty((a.shape[0], b.shape[1]))


class FeedForwardReLU(torch.autograd.Function):
    """relu(x @ weight1.T + bias1) @ weight2.T + bias2 for 2-D `x`, the first product with cuBLASLt's bias-and-ReLU
    epilogue; backward, the hidden gradient comes masked out of `relu_masked_product`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight1: Tensor, bias1: Tensor, weight2: Tensor, bias2: Tensor) -> Tensor:
        hidden = torch._addmm_activation(bias1, x, weight1.t())
        ctx.save_for_backward(x, weight1, hidden, weight2)
        return torch.addmm(bias2, hidden, weight2.t())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        x, weight1, hidden, weight2 = ctx.saved_tensors
        grad_hidden = relu_masked_product(grad, weight2, hidden)
        return grad_hidden @ weight1, *weight_and_bias_gradients(grad_hidden, x), grad.t() @ hidden, grad.sum(0)


def relu_feed_forward(linear1: nn.Linear, linear2: nn.Linear, x: Tensor) -> Tensor:
    """linear2(relu(linear1(x))) through `FeedForwardReLU`; under autocast the inputs are cast as autocast casts a
    linear layer's."""
    return in_autocast_dtype(FeedForwardReLU, x, linear1.weight, linear1.bias, linear2.weight, linear2.bias)

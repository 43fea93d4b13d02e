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
- **ReLU's mask in the product** (`FeedForwardReLU`, on top of the part above). Backward, the gradient of the hidden
  activation is the second product's input gradient, (batch x 3,900, 2,048), which cuBLAS writes and a second
  kernel reads again, with the activation, to zero it where the ReLU was off. Here both products are in one
  autograd function whose backward makes that gradient in one Triton kernel (`relu_masked_product_kernels`) that
  applies the mask to each tile as it writes it. It runs on CUDA, or on the CPU under Triton's interpreter
  (`TRITON_INTERPRET=1`, the tests), and needs the layer's feed-forward dropout off (rfdetr's default).

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

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, triton_kernels_run_on

LAYER = "rfdetr.models.transformer:TransformerDecoderLayer"
VIEWS, RELU_IN_PRODUCT, RELU_MASK_IN_PRODUCT = "views", "relu_in_product", "relu_mask_in_product"
# a 128 x 128 tile of the masked gradient a program, 64 of the inner dimension at a time, on 8 warps
TILE_M, TILE_N, TILE_K, GROUP_M, WARPS, STAGES = 128, 128, 64, 8, 8, 3

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


def weight_and_bias_gradients(grad: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of a product's weight and bias given its output's gradient `grad` and its input `x` (both 2-D),
    from one product: x gets a column of ones (the bias's gradient) and zeros to a multiple of 8 columns, for
    aligned products."""
    rows, width = x.shape
    x_and_ones = torch.cat([x, x.new_ones(rows, 1), x.new_zeros(rows, -(width + 1) % 8)], dim=1)
    weight_and_bias = grad.t() @ x_and_ones
    return weight_and_bias[:, :width], weight_and_bias[:, width]


def _in_autocast_dtype(function: Any, x: Tensor, *parameters: Tensor) -> Tensor:
    """`function.apply` on `x` flattened to 2-D and `parameters`, each cast as autocast casts a linear layer's inputs
    (where autocast is on), with autocast off inside; the output has x's leading dimensions."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    with torch.autocast(device, enabled=False):
        flat = x.reshape(-1, x.shape[-1]).to(dtype)
        out = function.apply(flat, *(parameter.to(dtype) for parameter in parameters))
    return out.view(*x.shape[:-1], -1)


def linear_relu(linear: nn.Linear, x: Tensor, function: type[LinearReLU] = LinearReLU) -> Tensor:
    """relu(linear(x)) through `function` (`LinearReLU`, or a variant of its backward to compare it with); under
    autocast the inputs are cast as autocast casts a linear layer's."""
    return _in_autocast_dtype(function, x, linear.weight, linear.bias)


@torch.library.custom_op("rfdetr_pipeline::relu_masked_product", mutates_args=())
def relu_masked_product(a: Tensor, b: Tensor, relu_out: Tensor) -> Tensor:
    """(a @ b) where relu_out > 0, else 0, in a's dtype, for 2-D a (M, K), b (K, N) and relu_out (M, N), in one
    Triton kernel (a custom op, so `torch.compile` keeps it in the compiled graph and CUDA graphs can record it)."""
    from rfdetr_coco_pipeline.hooks.patches.relu_masked_product_kernels import relu_masked_product_kernel

    a, b, relu_out = a.contiguous(), b.contiguous(), relu_out.contiguous()  # the kernel reads rows of each
    (rows, inner), columns = a.shape, b.shape[1]
    result = a.new_empty((rows, columns))
    tiles = -(-rows // TILE_M) * -(-columns // TILE_N)
    relu_masked_product_kernel[(tiles,)](
        a, b, relu_out, result, rows, columns, inner,
        BLOCK_M=TILE_M, BLOCK_N=TILE_N, BLOCK_K=TILE_K, GROUP_M=GROUP_M,
        # float32 products as torch computes them by default (no TF32)
        INPUT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=WARPS, num_stages=STAGES,
    )  # fmt: skip
    return result


@relu_masked_product.register_fake
def _(a, b, relu_out):  # noqa: ANN001, ANN202
    return a.new_empty((a.shape[0], b.shape[1]))


class FeedForwardReLU(torch.autograd.Function):
    """relu(x @ weight1.T + bias1) @ weight2.T + bias2 for 2-D `x`: the first product as `LinearReLU`'s, the second
    as a linear layer's; backward, the hidden activation's gradient comes masked out of one Triton product
    (`relu_masked_product`), and the first product's weight and bias gradients out of one product as in
    `LinearReLU`."""

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


def feed_forward_relu(linear1: nn.Linear, linear2: nn.Linear, x: Tensor) -> Tensor:
    """linear2(relu(linear1(x))) through `FeedForwardReLU`; under autocast the inputs are cast as autocast casts a
    linear layer's."""
    return _in_autocast_dtype(FeedForwardReLU, x, linear1.weight, linear1.bias, linear2.weight, linear2.bias)


def _plain_attention(attention: nn.Module) -> bool:
    return (
        type(attention) is nn.MultiheadAttention
        and attention.batch_first
        and attention._qkv_same_embed_dim
        and attention.in_proj_bias is not None
        and attention.bias_k is None
        and not attention.add_zero_attn
    )


def _relu_feed_forward(layer: nn.Module) -> bool:
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
        if RELU_IN_PRODUCT in _parts_on and _relu_feed_forward(self):
            if _mask_in_product(self, tgt):
                tgt2 = feed_forward_relu(self.linear1, self.linear2, tgt)
            else:
                tgt2 = self.linear2(self.dropout(linear_relu(self.linear1, tgt)))
        else:
            tgt2 = self.linear2(self.dropout(self.activation(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout3(tgt2))

    return forward_post

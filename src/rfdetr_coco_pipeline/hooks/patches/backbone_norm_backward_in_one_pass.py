"""In training, every residual sum of the backbone that a LayerNorm follows goes backward, with that norm, in one
Triton kernel, which also sums the layer scale's and the norm's parameter gradients.

Each of the backbone's 12 layers adds a scaled branch to the residual stream twice: h = x + scale1 * attention,
then norm2(h) feeds the feed-forward block; and out = h + scale2 * feed-forward, then the next layer's norm1(out)
feeds its attention. Backward, Inductor computes the gradients of the stream and the branch row by row in one
kernel, then reads the gradients and the activations again in separate column reductions for the gradients of the
scale and of the norm's weight and bias: three passes over (batch x windows x tokens) rows of 384 floats, where one
suffices.

Here each such pair, y = x + scale * a and z = LayerNorm(y), is `residual_norm`: torch's own forward
(`torch.native_layer_norm`, which Inductor fuses as before) inside an autograd function whose backward is
`rfdetr_pipeline::residual_norm_backward`, a custom operator (so `torch.compile` keeps it in the compiled graph and
CUDA graphs can record it) that runs `residual_norm_kernels` once over the rows. The encoder's loop is rfdetr's,
with each layer's output sum carried into the next layer's norm1 (the first layer's norm1 and the last layer's sum
stay plain); the layers' attention and feed-forward blocks are rfdetr's modules. Under autocast z comes out in the
autocast dtype, which the next products cast it to anyway, so its gradient arrives in that dtype without a float32
copy.

Guarantees: the hidden states and every gradient are rfdetr's up to floating-point rounding (the same sums in
another order). It applies in training, to plain layers (no drop path, LayerNorms with weight and bias, rows of at
most 1,024, no gradient checkpointing, no attention maps asked for), on CUDA tensors, or on the CPU under Triton's
interpreter (`TRITON_INTERPRET=1`, the tests); any other call is rfdetr's. It needs Triton (the registry's `needs`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, triton_kernels_run_on

ENCODER = "rfdetr.models.backbone.dinov2_with_windowed_attn:WindowedDinov2WithRegistersEncoder"
# One row at a time on two warps, eight programs a multiprocessor: of the tiles (1-16 rows), warps (2-8) and
# programs (1-8 a multiprocessor) tried on an H100 (bench.norm_kernel_configs), the fastest whose outputs match.
TILE = 1  # rows a program holds at once
WARPS = 2
PROGRAMS_PER_MULTIPROCESSOR = 8
PROGRAMS = 16  # where no GPU says how many fit (Triton's interpreter): few, so that each loops over rows as on a GPU


def _kernels() -> Any:
    from rfdetr_coco_pipeline.hooks.patches import residual_norm_kernels

    return residual_norm_kernels


@torch.library.custom_op("rfdetr_pipeline::residual_norm_backward", mutates_args=())
def residual_norm_backward(
    grad_z: Tensor,
    grad_h: Tensor,
    h: Tensor,
    a: Tensor,
    mean: Tensor,
    rstd: Tensor,
    scale: Tensor,
    weight: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of x and a, and those of scale, weight and bias as the rows of one float32 (3, channels) tensor,
    of h = x + scale * a, z = LayerNorm(h) (rows of h's last dimension; mean and rstd the norm's per-row statistics),
    given those of z and h, in one pass over the rows. The three parameter gradients come from one sum of the
    programs' partial sums (a custom op's outputs may not be views of each other: the caller splits them)."""
    channels = h.shape[-1]
    rows = h.numel() // channels
    block = triton_block(channels)
    programs = max(1, min(programs_that_fit(h), -(-rows // TILE)))
    grad_x = torch.empty_like(h, dtype=torch.float32)
    grad_a = torch.empty_like(a)
    partial = torch.empty((3, programs, block), device=h.device, dtype=torch.float32)
    _kernels().residual_norm_backward_kernel[(programs,)](
        grad_z.contiguous(),
        grad_h.contiguous(),
        h.contiguous(),
        a.contiguous(),
        mean.contiguous(),
        rstd.contiguous(),
        scale.contiguous(),
        weight.contiguous(),
        grad_x,
        grad_a,
        partial[0],
        partial[1],
        partial[2],
        rows,
        channels,
        TILE=TILE,
        BLOCK_C=block,
        num_warps=WARPS,
    )
    return grad_x, grad_a, partial[:, :, :channels].sum(1)


@residual_norm_backward.register_fake
def _(grad_z, grad_h, h, a, mean, rstd, scale, weight):  # noqa: ANN001, ANN202
    return (
        torch.empty_like(h, dtype=torch.float32),
        torch.empty_like(a),
        h.new_empty((3, h.shape[-1]), dtype=torch.float32),
    )


def programs_that_fit(h: Tensor) -> int:
    """As many programs as the GPU holds at once, so the rows take one wave; PROGRAMS elsewhere."""
    if not h.is_cuda:
        return PROGRAMS
    return torch.cuda.get_device_properties(h.device).multi_processor_count * PROGRAMS_PER_MULTIPROCESSOR


def triton_block(channels: int) -> int:
    """The power of two that holds a row of `channels` (Triton's blocks are powers of two)."""
    return 1 << (channels - 1).bit_length()


class ResidualNorm(torch.autograd.Function):
    """(h, z) = (x + scale * a, LayerNorm(h) as `out_dtype`), forward with torch's ops, backward in one kernel."""

    @staticmethod
    def forward(  # noqa: ANN205
        ctx: Any, x: Tensor, a: Tensor, scale: Tensor, weight: Tensor, bias: Tensor, eps: float, out_dtype: torch.dtype
    ):
        h = x + a * scale  # float32 as in rfdetr: a float32 scale promotes a bf16 `a`
        z, mean, rstd = torch.native_layer_norm(h, (h.shape[-1],), weight, bias, eps)
        ctx.save_for_backward(h, a, mean, rstd, scale, weight)
        return h, z.to(out_dtype)

    @staticmethod
    def backward(ctx: Any, grad_h: Tensor, grad_z: Tensor):  # noqa: ANN205
        # autograd hands zeros for an output that got no gradient (materialize_grads, its default)
        h, a, mean, rstd, scale, weight = ctx.saved_tensors
        grad_x, grad_a, grad_params = residual_norm_backward(grad_z, grad_h, h, a, mean, rstd, scale, weight)
        grad_scale, grad_weight, grad_bias = grad_params.unbind(0)
        return (
            grad_x,
            grad_a,
            grad_scale.to(scale.dtype),
            grad_weight.to(weight.dtype),
            grad_bias.to(weight.dtype),
            None,
            None,
        )


def residual_norm(x: Tensor, a: Tensor, scale: Tensor, norm: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    """(x + scale * a, norm of it): the norm's output in the autocast dtype where autocast is on (what the next
    product computes in), else float32 as rfdetr's."""
    device = x.device.type
    out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    with torch.autocast(device, enabled=False):
        return ResidualNorm.apply(x, a, scale, norm.weight, norm.bias, norm.eps, out_dtype)


def _plain_norm(norm: nn.Module, x: Tensor) -> bool:
    return (
        type(norm) is nn.LayerNorm
        and norm.weight is not None
        and norm.bias is not None
        and norm.normalized_shape == (x.shape[-1],)
    )


def _plain(encoder: Any, x: Tensor) -> bool:
    return (
        not encoder.gradient_checkpointing
        and x.dim() == 3
        and x.shape[-1] <= 1024
        and x.dtype == torch.float32
        and all(
            type(layer.drop_path) is nn.Identity and _plain_norm(layer.norm1, x) and _plain_norm(layer.norm2, x)
            for layer in encoder.layer
        )
    )


def layer_parts(layer: Any, x: Tensor, normed: Tensor, full_attention: bool) -> tuple[Tensor, Tensor]:
    """rfdetr's layer on input `x` whose `norm1` is `normed`, up to its last residual sum: h = x + scale1 *
    attention and the feed-forward block's output (the layer's output is h + scale2 * that)."""
    windows, tokens, channels = x.shape
    squared = layer.num_windows**2
    if full_attention:  # rfdetr's: the windows of an image as one sequence, and back
        normed = normed.view(windows // squared, squared * tokens, channels)
    attention_output = layer.attention(normed, output_attentions=False)[0]
    if full_attention:
        attention_output = attention_output.view(windows, tokens, channels)
    h, z = residual_norm(x, attention_output, layer.layer_scale1.lambda1, layer.norm2)
    return h, layer.mlp(z)


def encoder_with_one_pass_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `WindowedDinov2WithRegistersEncoder.forward` in training with every residual sum that a LayerNorm
    follows through `residual_norm`: each layer's first (into its norm2) and each layer's last (into the next
    layer's norm1); otherwise `original`."""

    def forward(
        self: Any,
        hidden_states: Tensor,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
    ) -> Any:
        lean = self.training and not output_attentions and triton_kernels_run_on(hidden_states)
        if not (lean and _plain(self, hidden_states)):
            return original(self, hidden_states, output_attentions, output_hidden_states, return_dict)
        from transformers.modeling_outputs import BaseModelOutput

        all_hidden_states: tuple[Tensor, ...] | None = () if output_hidden_states else None
        last_feature = self.config.out_features[-1]
        early_stop_layer = int(last_feature[5:]) if last_feature.startswith("stage") else None
        # the previous layer's h, feed-forward output and second scale: this layer's input is h + scale * output
        pending: tuple[Tensor, Tensor, Tensor] | None = None
        for i, layer in enumerate(self.layer):
            stops = early_stop_layer is not None and i > early_stop_layer
            if pending is None:
                normed = layer.norm1(hidden_states)
            elif stops:
                h, output, scale = pending
                hidden_states = output * scale + h
            else:
                hidden_states, normed = residual_norm(pending[0], pending[1], pending[2], layer.norm1)
            if all_hidden_states is not None:
                all_hidden_states = all_hidden_states + (hidden_states,)
            if stops:  # rfdetr's early stop after the last layer an output feature needs
                pending = None
                break
            full_attention = i not in self.config.window_block_indexes
            h, output = layer_parts(layer, hidden_states, normed, full_attention)
            pending = (h, output, layer.layer_scale2.lambda1)
        if pending is not None:
            h, output, scale = pending
            hidden_states = output * scale + h
        if all_hidden_states is not None:
            all_hidden_states = all_hidden_states + (hidden_states,)
        if not return_dict:
            return tuple(v for v in (hidden_states, all_hidden_states) if v is not None)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=None)

    return forward


def backbone_norm_backward_in_one_pass() -> AbstractContextManager[None]:
    """Within this block rfdetr's backbone in training takes each residual sum that a LayerNorm follows backward in
    one kernel (see the module's text)."""
    return patch_rfdetr(ENCODER, "forward", encoder_with_one_pass_backward)

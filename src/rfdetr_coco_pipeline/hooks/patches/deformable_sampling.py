"""The decoder's deformable-attention sampling on the GPU with Triton kernels whose backward pass writes its
gradients into channel-contiguous memory.

rfdetr samples the decoder's value map with `F.grid_sample` (bilinear, zero padding, `align_corners=False`):
for RF-DETR Nano at batch 128, 2,048 maps (batch x 16 heads) of 16 channels at 24 x 24, each sampled at 7,800
points, twice per step. Its backward pass adds each sample's gradient into the four neighbouring pixels of every
channel with one atomic addition each, about 10^9 per call, scattered over memory (channels are 576 values apart):
one of the largest kernels of a training step.

This replaces rfdetr's private `_bilinear_grid_sample`, as imported by its deformable-attention function
(`rfdetr.models.ops.functions.ms_deform_attn_func`), with a custom operator for the CUDA case: the same arithmetic
(PyTorch's `grid_sampler_2d` formulas), with the 16 channels of a pixel next to each other, so the atomic additions
of neighbouring threads land in the same cache line. The operator is registered with `torch.library`, so
`torch.compile` keeps it inside the compiled graph and CUDA graphs can record it. Other devices keep rfdetr's code.
It needs Triton (the registry's `needs`): where triton does not import, `train.speedups: auto` leaves it off and
`all`, or a list naming it, refuses to train (`select_speedups`).

Guarantees: forward values and the gradient with respect to the sampling grid match `F.grid_sample` to float32
rounding, and the gradient of the map up to the order of the atomic additions, which `F.grid_sample` leaves
unspecified too.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

log = logging.getLogger(__name__)

BLOCK = 64  # sampling points per Triton program


def _triton_kernels() -> Any:
    """The kernels' module, imported on first use (Triton is needed only where a GPU samples)."""
    from rfdetr_coco_pipeline.hooks.patches import deformable_sampling_kernels

    return deformable_sampling_kernels


def _launch_grid(samples: int, maps: int) -> tuple[int, int]:
    return (-(-samples // BLOCK), maps)


@torch.library.custom_op("rfdetr_pipeline::bilinear_sample_pixels", mutates_args=())
def bilinear_sample_pixels(pixels: Tensor, grid: Tensor) -> Tensor:
    """Bilinear, zero-padded, corner-unaligned samples of float32 CUDA maps stored channels-last: pixels
    (N, H, W, C), grid (N, Hg, Wg, 2); returns (N, C, Hg, Wg)."""
    n, h, w, c = pixels.shape
    _, hg, wg, _ = grid.shape
    samples = hg * wg
    out = torch.empty((n, c, hg, wg), device=pixels.device, dtype=torch.float32)
    _triton_kernels().forward_kernel[_launch_grid(samples, n)](
        pixels.contiguous(), grid.contiguous(), out, samples, h, w, C=c, BLOCK=BLOCK
    )
    return out


@bilinear_sample_pixels.register_fake
def _(pixels: Tensor, grid: Tensor) -> Tensor:
    return pixels.new_empty((pixels.shape[0], pixels.shape[3], grid.shape[1], grid.shape[2]))


@torch.library.custom_op("rfdetr_pipeline::bilinear_sample_pixels_backward", mutates_args=())
def bilinear_sample_pixels_backward(grad_out: Tensor, pixels: Tensor, grid: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of `bilinear_sample_pixels` with respect to pixels (channels-last, as they came) and grid."""
    n, h, w, c = pixels.shape
    _, hg, wg, _ = grid.shape
    samples = hg * wg
    grad_pixels = torch.zeros((n, h, w, c), device=pixels.device, dtype=torch.float32)
    grad_grid = torch.empty((n, hg, wg, 2), device=pixels.device, dtype=torch.float32)
    _triton_kernels().backward_kernel[_launch_grid(samples, n)](
        grad_out.contiguous(),
        pixels.contiguous(),
        grid.contiguous(),
        grad_pixels,
        grad_grid,
        samples,
        h,
        w,
        C=c,
        BLOCK=BLOCK,
    )
    return grad_pixels, grad_grid


@bilinear_sample_pixels_backward.register_fake
def _(grad_out: Tensor, pixels: Tensor, grid: Tensor) -> tuple[Tensor, Tensor]:
    return pixels.new_empty(pixels.shape), grid.new_empty(grid.shape)


def _setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor]:
    pixels, grid = ctx.saved_tensors
    return bilinear_sample_pixels_backward(grad_out, pixels, grid)


bilinear_sample_pixels.register_autograd(_backward, setup_context=_setup_context)


def bilinear_sample(value: Tensor, grid: Tensor) -> Tensor:
    """`F.grid_sample(value, grid, mode="bilinear", padding_mode="zeros", align_corners=False)` for float32 CUDA
    tensors: value (N, C, H, W), grid (N, Hg, Wg, 2); returns (N, C, Hg, Wg). The channels-last copy of the map is
    made here, outside the operator, so that under torch.compile Inductor writes it in the kernel that makes the
    map (the cast to float32 included) and takes its gradient back to the map's layout the same way."""
    return bilinear_sample_pixels(value.permute(0, 2, 3, 1).contiguous(), grid)


def sample_on_device(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """rfdetr's `_bilinear_grid_sample`, with the zero-padded, corner-unaligned CUDA case on our kernels."""

    def bilinear_grid_sample(
        input: Tensor, grid: Tensor, padding_mode: str = "zeros", align_corners: bool = False
    ) -> Tensor:
        channels = input.shape[1]
        if input.is_cuda and padding_mode == "zeros" and not align_corners and (channels & (channels - 1)) == 0:
            # float32, as F.grid_sample computes under autocast (grid_sampler is on autocast's float32 list)
            return bilinear_sample(input.float(), grid.float())
        return original(input, grid, padding_mode=padding_mode, align_corners=align_corners)

    return bilinear_grid_sample


def deformable_sampling() -> AbstractContextManager[None]:
    """Within this block rfdetr's deformable attention samples with our CUDA kernels (see the module's text).
    Entered without Triton (it comes with torch's Linux CUDA wheels; `select_speedups` selects it only where triton
    imports), rfdetr's code stays and the log says so."""
    if importlib.util.find_spec("triton") is None:
        log.warning("Triton is not installed: the decoder samples with rfdetr's F.grid_sample (slower on a GPU)")
        return nullcontext()
    return patch_rfdetr("rfdetr.models.ops.functions.ms_deform_attn_func", "_bilinear_grid_sample", sample_on_device)

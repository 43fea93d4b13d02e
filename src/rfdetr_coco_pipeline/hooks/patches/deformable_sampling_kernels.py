"""Triton kernels of `deformable_sampling`: bilinear sampling with zero padding and `align_corners=False`
of (N, H, W, C) maps, and its backward pass, with grid_sampler_2d's formulas. Imported only where a GPU samples.

Their values and gradients are `F.grid_sample`'s to float32 rounding.
"""

import triton
import triton.language as tl


@triton.jit
def unnormalize(grid_ptr, n, s, S, H, W):
    valid = s < S
    x = tl.load(grid_ptr + (n * S + s) * 2, mask=valid, other=0.0)
    y = tl.load(grid_ptr + (n * S + s) * 2 + 1, mask=valid, other=0.0)
    # grid_sampler_unnormalize with align_corners=False
    return valid, ((x + 1) * W - 1) * 0.5, ((y + 1) * H - 1) * 0.5


@triton.jit
def pixel_offsets(valid, cx, cy, n, H, W, C: tl.constexpr):
    """Offsets of one corner's C channels in a (N, H, W, C) map, and which samples have that corner inside."""
    inside = valid & (cx >= 0) & (cx < W) & (cy >= 0) & (cy < H)
    pixel = tl.where(inside, (n * H + cy.to(tl.int32)) * W + cx.to(tl.int32), 0).to(tl.int64)
    return pixel[:, None] * C + tl.arange(0, C)[None, :], inside[:, None]


@triton.jit
def forward_kernel(value_ptr, grid_ptr, out_ptr, S, H, W, C: tl.constexpr, BLOCK: tl.constexpr):
    # value: (N, H, W, C) contiguous; grid: (N, S, 2); out: (N, C, S)
    n = tl.program_id(1)
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid, ix, iy = unnormalize(grid_ptr, n, s, S, H, W)
    x0 = tl.floor(ix)
    y0 = tl.floor(iy)
    x1 = x0 + 1
    y1 = y0 + 1
    # each corner weighs the area of the rectangle opposite it, as in grid_sampler_2d
    at, inside = pixel_offsets(valid, x0, y0, n, H, W, C)
    out = ((x1 - ix) * (y1 - iy))[:, None] * tl.load(value_ptr + at, mask=inside, other=0.0)
    at, inside = pixel_offsets(valid, x1, y0, n, H, W, C)
    out += ((ix - x0) * (y1 - iy))[:, None] * tl.load(value_ptr + at, mask=inside, other=0.0)
    at, inside = pixel_offsets(valid, x0, y1, n, H, W, C)
    out += ((x1 - ix) * (iy - y0))[:, None] * tl.load(value_ptr + at, mask=inside, other=0.0)
    at, inside = pixel_offsets(valid, x1, y1, n, H, W, C)
    out += ((ix - x0) * (iy - y0))[:, None] * tl.load(value_ptr + at, mask=inside, other=0.0)
    c = tl.arange(0, C)
    tl.store(out_ptr + (n * C + c[None, :]).to(tl.int64) * S + s[:, None], out, mask=valid[:, None])


@triton.jit
def corner_backward(grad_value_ptr, value_ptr, g, at, inside, weight):
    """Add one corner's share of the output gradient to the map's gradient; return sum_c value * grad."""
    tl.atomic_add(grad_value_ptr + at, weight[:, None] * g, mask=inside, sem="relaxed")
    return tl.sum(tl.load(value_ptr + at, mask=inside, other=0.0) * g, axis=1)


@triton.jit
def backward_kernel(
    grad_out_ptr, value_ptr, grid_ptr, grad_value_ptr, grad_grid_ptr, S, H, W, C: tl.constexpr, BLOCK: tl.constexpr
):
    # grad_out: (N, C, S); value and grad_value: (N, H, W, C); grid and grad_grid: (N, S, 2)
    n = tl.program_id(1)
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.arange(0, C)
    valid, ix, iy = unnormalize(grid_ptr, n, s, S, H, W)
    x0 = tl.floor(ix)
    y0 = tl.floor(iy)
    x1 = x0 + 1
    y1 = y0 + 1
    g = tl.load(grad_out_ptr + (n * C + c[None, :]).to(tl.int64) * S + s[:, None], mask=valid[:, None], other=0.0)
    at, inside = pixel_offsets(valid, x0, y0, n, H, W, C)
    nw = corner_backward(grad_value_ptr, value_ptr, g, at, inside, (x1 - ix) * (y1 - iy))
    at, inside = pixel_offsets(valid, x1, y0, n, H, W, C)
    ne = corner_backward(grad_value_ptr, value_ptr, g, at, inside, (ix - x0) * (y1 - iy))
    at, inside = pixel_offsets(valid, x0, y1, n, H, W, C)
    sw = corner_backward(grad_value_ptr, value_ptr, g, at, inside, (x1 - ix) * (iy - y0))
    at, inside = pixel_offsets(valid, x1, y1, n, H, W, C)
    se = corner_backward(grad_value_ptr, value_ptr, g, at, inside, (ix - x0) * (iy - y0))
    # the derivatives of the four weights by ix and by iy (grid_sampler_2d_backward's gix and giy)
    gix = -nw * (y1 - iy) + ne * (y1 - iy) - sw * (iy - y0) + se * (iy - y0)
    giy = -nw * (x1 - ix) - ne * (ix - x0) + sw * (x1 - ix) + se * (ix - x0)
    tl.store(grad_grid_ptr + (n * S + s) * 2, gix * (W * 0.5), mask=valid)
    tl.store(grad_grid_ptr + (n * S + s) * 2 + 1, giy * (H * 0.5), mask=valid)

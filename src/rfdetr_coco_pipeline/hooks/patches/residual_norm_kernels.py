"""Triton kernel of `backbone_norm_backward_in_one_pass`: the backward pass of h = x + scale * a, z = LayerNorm(h),
for rows of C values, in one pass over the rows that also sums the three parameter gradients. Imported only where
the kernel runs (a GPU, or Triton's interpreter in the tests).

Each program walks its share of the rows, a tile of TILE rows at a time, and keeps its column sums in registers; it
writes one row of partial sums for the scale, the norm's weight and its bias, which the caller adds up.
"""

import triton
import triton.language as tl


@triton.jit
def residual_norm_backward_kernel(
    grad_z_ptr,
    grad_h_ptr,
    h_ptr,
    a_ptr,
    mean_ptr,
    rstd_ptr,
    scale_ptr,
    weight_ptr,
    grad_x_ptr,
    grad_a_ptr,
    partial_scale_ptr,
    partial_weight_ptr,
    partial_bias_ptr,
    rows,
    C,
    TILE: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_C)
    in_row = cols < C
    scale = tl.load(scale_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    sum_scale = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_weight = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(program * TILE, rows, programs * TILE):
        r = start + tl.arange(0, TILE)
        valid = (r < rows)[:, None] & in_row[None, :]
        at = r[:, None].to(tl.int64) * C + cols[None, :]
        grad_z = tl.load(grad_z_ptr + at, mask=valid, other=0.0).to(tl.float32)
        grad_h = tl.load(grad_h_ptr + at, mask=valid, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + at, mask=valid, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + at, mask=valid, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + r, mask=r < rows, other=0.0)
        rstd = tl.load(rstd_ptr + r, mask=r < rows, other=0.0)
        normalized = tl.where(valid, (h - mean[:, None]) * rstd[:, None], 0.0)
        weighted = grad_z * weight[None, :]
        # LayerNorm's input gradient: rstd * (g - mean(g) - normalized * mean(g * normalized)), g the weighted grad
        mean_weighted = tl.sum(weighted, axis=1) / C
        mean_projection = tl.sum(weighted * normalized, axis=1) / C
        grad_x = grad_h + rstd[:, None] * (weighted - mean_weighted[:, None] - normalized * mean_projection[:, None])
        grad_x = tl.where(valid, grad_x, 0.0)
        tl.store(grad_x_ptr + at, grad_x, mask=valid)
        tl.store(grad_a_ptr + at, (grad_x * scale[None, :]).to(grad_a_ptr.dtype.element_ty), mask=valid)
        sum_scale += tl.sum(grad_x * a, axis=0)
        sum_weight += tl.sum(grad_z * normalized, axis=0)
        sum_bias += tl.sum(grad_z, axis=0)
    tl.store(partial_scale_ptr + program * BLOCK_C + cols, sum_scale)
    tl.store(partial_weight_ptr + program * BLOCK_C + cols, sum_weight)
    tl.store(partial_bias_ptr + program * BLOCK_C + cols, sum_bias)

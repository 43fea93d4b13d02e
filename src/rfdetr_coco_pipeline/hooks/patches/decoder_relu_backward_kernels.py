"""Triton kernel of `decoder_relu_backward_in_the_product`: the matrix product `grad @ weight` with the ReLU's
backward (zero where the ReLU's output is zero) applied before it is written, and the column sums of what each block
of rows wrote. Imported only where it runs (a GPU, or Triton's interpreter in the tests).

The product accumulates in float32 (float32 inputs multiplied as torch's float32 products are: TF32 only where
torch allows it) and is rounded once to the output's dtype, as cuBLAS rounds it; the sums are of
the rounded values, as `out.sum(0)` would read them.
"""

import triton
import triton.language as tl


@triton.jit
def masked_product_kernel(
    grad_ptr,
    weight_ptr,
    hidden_ptr,
    out_ptr,
    sums_ptr,
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # grad (M, K), weight (K, N), hidden and out (M, N): contiguous; sums (cdiv(M, BLOCK_M), N) float32.
    # N and K are multiples of BLOCK_N and BLOCK_K. Neighbouring programs take the column blocks of one row block,
    # so that block of `grad` is read from memory once and from L2 by the others (`weight` stays in L2 throughout).
    pid = tl.program_id(0)
    block_m = pid // (N // BLOCK_N)
    block_n = pid % (N // BLOCK_N)
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    inside = (rows < M)[:, None]
    row_starts = rows[:, None].to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(grad_ptr + row_starts * K + (k + ks)[None, :], mask=inside, other=0.0)
        b = tl.load(weight_ptr + (k + ks)[:, None] * N + cols[None, :])
        acc += tl.dot(a, b, input_precision=PRECISION)
    at = row_starts * N + cols[None, :]
    hidden = tl.load(hidden_ptr + at, mask=inside, other=0.0)
    out = tl.where(hidden > 0, acc, 0.0).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + at, out, mask=inside)
    tl.store(sums_ptr + block_m * N + cols, tl.sum(out.to(tl.float32), axis=0))

"""The Triton kernel of `decoder_relu_mask_in_the_product`: the product a @ b with ReLU's backward applied as it is
written, for contiguous row-major a (M, K), b (K, N), saved and c (M, N): c = (a @ b) where saved > 0, else 0; saved
is ReLU's output (or its input: the sign is the same).

Imported only where the kernel runs (a GPU, or Triton's interpreter in the tests).

Each program computes one BLOCK_M x BLOCK_N tile of c, accumulating in float32 over K, reads the same tile of saved
and writes the tile in c's dtype. With SAVED_FIRST it asks for saved's tile before the product's loop, so that the
read overlaps the product (K is short: 256) at the cost of the registers that hold it meanwhile. Programs run
in groups of GROUP_M tile rows, so the tiles of a's rows that neighbouring programs read are still in the L2 cache.
"""

import triton
import triton.language as tl


@triton.jit
def activation_grad_product_kernel(
    a_ptr,
    b_ptr,
    saved_ptr,
    c_ptr,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    SAVED_FIRST: tl.constexpr,
):
    program = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (program // in_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (program % in_group) % group_rows
    tile_n = (program % in_group) // group_rows

    # 64-bit offsets only for the tile's first row (M x N may pass 2**31 elements); 32-bit ones within the tile
    first_row = (tile_m * BLOCK_M).to(tl.int64)
    a_ptr += first_row * K
    saved_ptr += first_row * N
    c_ptr += first_row * N
    rows = tl.arange(0, BLOCK_M)
    rows_left = M - tile_m * BLOCK_M
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    inside = (rows[:, None] < rows_left) & (cols[None, :] < N)
    at = rows[:, None] * N + cols[None, :]
    if SAVED_FIRST:
        saved = tl.load(saved_ptr + at, mask=inside)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + inner
        # zeros past K, so a last partial step adds nothing
        a = tl.load(
            a_ptr + rows[:, None] * K + k[None, :], mask=(rows[:, None] < rows_left) & (k[None, :] < K), other=0.0
        )
        b = tl.load(b_ptr + k[:, None] * N + cols[None, :], mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    if not SAVED_FIRST:
        saved = tl.load(saved_ptr + at, mask=inside)
    result = tl.where(saved > 0, acc, 0.0)
    tl.store(c_ptr + at, result.to(c_ptr.dtype.element_ty), mask=inside)

"""Triton kernel of `normalization_in_one_kernel`: uint8 images to rfdetr's normalised float32 in one pass.
Imported only where the kernel runs (a GPU, or Triton's interpreter).

Each value goes through the operations rfdetr's transforms apply, in their order and in float32, each rounded as
PyTorch's kernels round it: the conversion, the multiplication by 1/255, the subtraction of the channel's mean, the
division by its standard deviation (IEEE-rounded, `div_rn`), and zero where the padding mask is set. The launch
turns off Triton's fusing of the multiplication and the subtraction into one FMA, which would round once instead of
twice.
"""

import triton
import triton.language as tl


@triton.jit
def normalize_kernel(
    images_ptr, padding_ptr, out_ptr, mean_ptr, std_ptr, scale, plane,
    CHANNELS: tl.constexpr, PADDED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # images, out: (N, CHANNELS, H, W) contiguous, plane = H * W; padding: (N, H, W) as uint8.
    # One program per block of one channel's plane: the channel is the program's, no division per value.
    row = tl.program_id(1)  # image * CHANNELS + channel
    within = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = within < plane
    offsets = row.to(tl.int64) * plane + within
    value = tl.load(images_ptr + offsets, mask=inside, other=0).to(tl.float32) * scale
    value = value - tl.load(mean_ptr + row % CHANNELS)
    value = tl.div_rn(value, tl.load(std_ptr + row % CHANNELS))
    if PADDED:
        pixel = (row // CHANNELS).to(tl.int64) * plane + within
        value = tl.where(tl.load(padding_ptr + pixel, mask=inside, other=0) != 0, 0.0, value)
    tl.store(out_ptr + offsets, value, mask=inside)

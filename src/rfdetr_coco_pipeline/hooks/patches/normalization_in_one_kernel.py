"""Make a batch's uint8 images rfdetr's normalised floats in one Triton kernel instead of five of PyTorch's.

`images_as_bytes` (and its validation side) converts each batch on the GPU with the operations rfdetr's transforms
run in the loader workers: a conversion to float32, a multiplication by 1/255, a subtraction of the mean, a division
by the standard deviation and zeros on the padding, each a pass of its own over 226 MB of float32 at batch 128 and
384 px. Here one kernel reads the 57 MB of bytes and writes the floats once (`normalization_kernels`). Inductor is
not used for this: its kernels may fuse the multiplication and the subtraction into one FMA and divide with
another rounding, and the floats would no longer be rfdetr's bit for bit.

Guarantees: the floats are those of `images_as_bytes`' PyTorch operations (so rfdetr's) bit for bit; where Triton
cannot run on the batch's device, those operations run as before; where neither `images_as_bytes` nor
`validation_images_as_bytes` is on, nothing changes and the log says so.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patches.images_as_bytes import HOOK, DeviceNormalize, normalize_in_torch
from rfdetr_coco_pipeline.hooks.patching import triton_kernels_run_on

log = logging.getLogger(__name__)
BLOCK = 1024


def normalize_in_one_kernel(images: Any, padding: Any, mean: Any, std: Any) -> Any:
    """`normalize_in_torch`'s floats for (N, C, H, W) uint8 `images`, (N, H, W) bool `padding` or None, and (C, 1, 1)
    float32 `mean` and `std` on the images' device, made by one kernel where Triton runs there."""
    import torch

    if not triton_kernels_run_on(images):
        return normalize_in_torch(images, padding, mean, std)
    from rfdetr_coco_pipeline.hooks.patches.normalization_kernels import normalize_kernel

    images = images.contiguous()
    floats = torch.empty(images.shape, dtype=torch.float32, device=images.device)
    count, channels, height, width = images.shape
    plane = height * width
    padded = padding is not None
    padding_bytes = padding.contiguous().view(torch.uint8) if padded else images  # unread when not padded
    normalize_kernel[((plane + BLOCK - 1) // BLOCK, count * channels)](
        images, padding_bytes, floats, mean.reshape(-1), std.reshape(-1), 1.0 / 255, plane,
        CHANNELS=channels, PADDED=padded, BLOCK=BLOCK, enable_fp_fusion=False,
    )  # fmt: skip
    return floats


@contextmanager
def normalization_in_one_kernel() -> Iterator[None]:
    """Within this block the conversion `images_as_bytes` runs on the GPU is one kernel (see the module's text)."""
    device_normalize = getattr(pkgutil.resolve_name(HOOK).on_after_batch_transfer, "device_normalize", None)
    if not isinstance(device_normalize, DeviceNormalize):
        log.info("normalization_in_one_kernel: nothing to do, images_as_bytes and validation_images_as_bytes are off")
        yield
        return
    device_normalize.convert = normalize_in_one_kernel
    try:
        yield
    finally:
        device_normalize.convert = normalize_in_torch

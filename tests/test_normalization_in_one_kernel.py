"""The normalization_in_one_kernel speedup: one Triton kernel gives images_as_bytes' floats (rfdetr's) bit for bit.

On the CPU the kernel runs in Triton's interpreter (`TRITON_INTERPRET=1`, in a fresh interpreter because Triton
reads it when the kernel is defined), and its PTX for Hopper is checked for the roundings the interpreter cannot
show; on the GPU it runs compiled, at the train stage's batch."""

from __future__ import annotations

import json

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches.images_as_bytes import normalize_in_torch
from rfdetr_coco_pipeline.hooks.patches.normalization_in_one_kernel import normalize_in_one_kernel
from tests.helpers.triton_interpreter import in_the_interpreter

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # rfdetr's Normalize


def mismatches(device: str, images: int, height: int, width: int, padded: bool) -> dict[str, int]:
    """How many floats of the kernel differ, bit for bit, from `normalize_in_torch`'s, on a batch holding every
    level of 255 in every channel, with the lower right of each image padded where `padded`."""
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (images, 3, height, width), dtype=torch.uint8, generator=generator)
    levels = min(256, pixels.numel())
    pixels.view(-1)[:levels] = torch.arange(levels, dtype=torch.uint8)
    padding = torch.zeros(images, height, width, dtype=torch.bool)
    padding[:, height // 2 :, width // 3 :] = True
    mean, std = (torch.tensor(values).view(-1, 1, 1).to(device) for values in (MEAN, STD))
    pixels, padding = pixels.to(device), (padding.to(device) if padded else None)
    ours, theirs = normalize_in_one_kernel(pixels, padding, mean, std), normalize_in_torch(pixels, padding, mean, std)
    assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape and ours.device == theirs.device
    return {
        "values": int((ours.view(torch.int32) != theirs.view(torch.int32)).sum()),
        "zeros": int((ours == 0).sum()),
        "their_zeros": int((theirs == 0).sum()),
    }


def test_in_tritons_interpreter_the_kernel_gives_the_floats_bit_for_bit():
    # 3 images of 3 x 37 x 29: 9,657 values, not a multiple of the kernel's block
    code = (
        "import json; from tests.test_normalization_in_one_kernel import mismatches; "
        "print(json.dumps([mismatches('cpu', 3, 37, 29, padded) for padded in (True, False)]))"
    )
    padded, unpadded = json.loads(in_the_interpreter(code).strip().splitlines()[-1])
    assert padded["values"] == unpadded["values"] == 0
    assert padded["zeros"] == padded["their_zeros"] >= 3 * 3 * 18 * 19  # the padding is zero in every channel


def test_for_hopper_the_kernel_divides_ieee_rounded_and_fuses_no_multiply_add():
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels; without it the kernel never runs")
    from rfdetr_coco_pipeline.hooks.patches.normalization_kernels import normalize_kernel
    from tests.helpers.hopper_kernels import compile_for_hopper

    signature = {
        "images_ptr": "*u8", "padding_ptr": "*u8", "out_ptr": "*fp32", "mean_ptr": "*fp32", "std_ptr": "*fp32",
        "scale": "fp32", "plane": "i32", "CHANNELS": "constexpr", "PADDED": "constexpr",
        "BLOCK": "constexpr",
    }  # fmt: skip
    constants = {"CHANNELS": 3, "PADDED": True, "BLOCK": 1024}
    ptx = compile_for_hopper(normalize_kernel, signature, constants, {"num_warps": 4, "enable_fp_fusion": False})
    assert "div.rn.f32" in ptx and "fma." not in ptx
    fused = compile_for_hopper(normalize_kernel, signature, constants, {"num_warps": 4})
    assert "fma.rn.f32" in fused  # what the launch's enable_fp_fusion=False keeps out


def test_other_devices_and_a_run_without_images_as_bytes_keep_the_torch_operations(caplog):
    from rfdetr_coco_pipeline.hooks.patches import normalization_in_one_kernel as extension

    assert mismatches("cpu", 2, 5, 7, padded=True)["values"] == 0  # on the CPU, without the interpreter: torch's
    with caplog.at_level("INFO"), extension.normalization_in_one_kernel():
        pass
    assert "nothing to do, images_as_bytes and validation_images_as_bytes are off" in caplog.text


def test_inside_images_as_bytes_the_conversion_is_the_kernel_and_afterwards_torchs_again():
    from rfdetr_coco_pipeline.hooks.patches.images_as_bytes import images_as_bytes
    from rfdetr_coco_pipeline.hooks.patches.normalization_in_one_kernel import normalization_in_one_kernel

    with images_as_bytes() as device_normalize:
        assert device_normalize.convert is normalize_in_torch
        with normalization_in_one_kernel():
            assert device_normalize.convert is normalize_in_one_kernel
        assert device_normalize.convert is normalize_in_torch


@pytest.mark.gpu
def test_on_the_gpu_the_kernel_gives_the_floats_bit_for_bit_at_the_train_stages_batch():
    for padded in (True, False):
        found = mismatches("cuda", 128, 384, 384, padded)
        assert found["values"] == 0 and found["zeros"] == found["their_zeros"], (padded, found)

"""The batch_copy_beside_the_step speedup: a batch's images reach the GPU on a stream of their own, with rfdetr's
values, while the work queued before them still runs."""

from __future__ import annotations

import json

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches import batch_copy_beside_the_step as extension
from tests.test_targets_one_copy import assert_same_targets, packed_batch


def host_batch(pinned: bool = False):
    """A batch as rfdetr's training loader hands it over: uint8 images with a padding mask, packed targets."""
    from rfdetr.utilities.tensors import NestedTensor

    images = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    mask = torch.zeros(4, 64, 64, dtype=torch.bool)
    mask[1, 40:] = True
    packed = packed_batch()
    if pinned:
        images, mask, packed = images.pin_memory(), mask.pin_memory(), packed.pin_memory()
    return NestedTensor(images, mask, no_padding=False), packed


def assert_same_batch(ours, theirs, device: str) -> None:
    (samples, targets), (rfdetr_samples, rfdetr_targets) = ours, theirs
    for mine, rfdetr_s in ((samples.tensors, rfdetr_samples.tensors), (samples.mask, rfdetr_samples.mask)):
        assert mine.device.type == device and mine.dtype == rfdetr_s.dtype and torch.equal(mine, rfdetr_s)
    assert samples.no_padding == rfdetr_samples.no_padding
    assert_same_targets(targets, rfdetr_targets, device)


def test_a_cpu_destination_keeps_rfdetrs_code_and_the_method_is_restored():
    from rfdetr.training.module_data import RFDETRDataModule

    original = RFDETRDataModule.transfer_batch_to_device
    batch = host_batch()
    with extension.batch_copy_beside_the_step():
        assert RFDETRDataModule.transfer_batch_to_device is not original
        moved = RFDETRDataModule.transfer_batch_to_device(None, batch, torch.device("cpu"), 0)
    assert RFDETRDataModule.transfer_batch_to_device is original
    assert_same_batch(moved, original(None, batch, torch.device("cpu"), 0), "cpu")


@pytest.mark.gpu
def test_on_the_gpu_the_images_arrive_with_rfdetrs_values_while_the_queued_work_runs(tmp_path):
    from rfdetr.training.module_data import RFDETRDataModule

    original = RFDETRDataModule.transfer_batch_to_device
    batch = host_batch(pinned=True)
    expected = original(None, batch, torch.device("cuda"), 0)
    product = torch.randn(4096, 4096, device="cuda")
    with extension.batch_copy_beside_the_step():
        RFDETRDataModule.transfer_batch_to_device(None, batch, torch.device("cuda"), 0)  # as a loop's first step
    torch.cuda.synchronize()
    with extension.batch_copy_beside_the_step(), torch.profiler.profile() as profile:
        for _ in range(20):  # the previous step's work, queued before the batch
            product = product @ product / 64
        moved = RFDETRDataModule.transfer_batch_to_device(None, batch, torch.device("cuda"), 0)
        checksum = moved[0].tensors.sum()  # the step reading its batch, on the step's stream
        torch.cuda.synchronize()
    assert_same_batch(moved, expected, "cuda")
    assert checksum.item() == batch[0].tensors.sum().item()

    profile.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    products = [e for e in kernels if "gemm" in e["name"].lower() or "nvjet" in e["name"] or "cutlass" in e["name"]]
    image_bytes = batch[0].tensors.numel()
    (image_copy,) = [e for e in events if e.get("cat") == "gpu_memcpy" and e["args"].get("bytes") == image_bytes]
    assert products and image_copy["args"]["stream"] != products[0]["args"]["stream"]
    assert image_copy["ts"] < products[-1]["ts"] + products[-1]["dur"]  # it ran before the queued work had ended
    (reading,) = [e for e in kernels if e["ts"] > products[-1]["ts"] and "reduce" in e["name"]]
    assert reading["ts"] >= image_copy["ts"] + image_copy["dur"]  # the step read the images after their copy

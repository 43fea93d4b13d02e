"""The targets_one_copy speedup: a batch's targets reach the GPU in one copy per field, with the same values."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches import targets_one_copy as extension


def packed_batch():
    """rfdetr's own packing of a batch like its COCO loader's, with an image without objects."""
    from rfdetr.utilities.tensors import pack_targets

    targets = []
    for i, objects in enumerate([3, 0, 1, 5]):
        targets.append(
            {
                "boxes": torch.rand(objects, 4),
                "labels": torch.randint(1, 91, (objects,)),
                "area": torch.rand(objects) * 1000,
                "iscrowd": torch.zeros(objects, dtype=torch.int64),
                "image_id": torch.tensor(100 + i),
                "orig_size": torch.tensor([480, 640]),
                "size": torch.tensor([384, 384]),
            }
        )
    packed = pack_targets(targets)
    assert type(packed).__name__ == "PackedTargets", "rfdetr did not pack this batch"
    return packed


def assert_same_targets(ours, theirs, device):
    assert len(ours) == len(theirs)
    for mine, rfdetr_s in zip(ours, theirs, strict=True):
        assert mine.keys() == rfdetr_s.keys()
        for key in mine:
            assert mine[key].device.type == device and rfdetr_s[key].device.type == device
            assert mine[key].dtype == rfdetr_s[key].dtype and mine[key].shape == rfdetr_s[key].shape, key
            assert torch.equal(mine[key], rfdetr_s[key]), key


def test_one_copy_per_field_gives_rfdetrs_targets():
    packed = packed_batch()
    assert_same_targets(extension.split_after_one_copy(packed, "cpu"), packed.to_list("cpu"), "cpu")


def test_a_write_to_one_images_targets_leaves_the_others_and_the_packed_source_alone():
    """Also when the packed targets are on the destination already (validation_batches_on_device keeps them there)."""
    packed = packed_batch()
    source = {key: flat.clone() for key, flat in packed.fields.items()}
    targets = extension.split_after_one_copy(packed, "cpu")
    before = [t["boxes"].clone() for t in targets]
    targets[0]["boxes"].mul_(0)
    targets[2]["labels"].fill_(7)
    assert torch.equal(targets[0]["boxes"], torch.zeros_like(before[0]))
    assert all(torch.equal(t["boxes"], b) for t, b in zip(targets[1:], before[1:], strict=True))
    assert targets[3]["labels"].tolist() == packed.to_list("cpu")[3]["labels"].tolist()
    assert all(torch.equal(packed.fields[key], flat) for key, flat in source.items())


def test_the_extension_keeps_rfdetrs_code_for_a_cpu_destination_and_restores_it():
    from rfdetr.utilities.tensors import PackedTargets

    original = PackedTargets.to_list
    packed = packed_batch()
    with extension.targets_one_copy():
        assert PackedTargets.to_list is not original
        moved = packed.to_list("cpu")
    assert PackedTargets.to_list is original
    assert_same_targets(moved, original(packed, "cpu"), "cpu")


@pytest.mark.gpu
def test_on_the_gpu_the_targets_arrive_with_rfdetrs_values_in_one_copy_per_field():
    packed = packed_batch().pin_memory()
    expected = packed.to_list("cuda", non_blocking=True)
    with extension.targets_one_copy():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            moved = packed.to_list("cuda", non_blocking=True)
            torch.cuda.synchronize()
    copies = [e for e in profile.events() if "Memcpy HtoD" in e.name]
    assert len(copies) == len(packed.fields)  # one per field, not one per field and image
    assert_same_targets(moved, expected, "cuda")

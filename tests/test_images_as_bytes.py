"""The images_as_bytes speedup: training batches travel as uint8 and become rfdetr's normalised floats, bit for bit."""

from __future__ import annotations

import random

import numpy
import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches.images_as_bytes import (
    DeviceNormalize,
    RelativeTargets,
    bytes_pipeline,
    images_as_bytes,
)
from rfdetr_coco_pipeline.hooks.patches.validation_images_as_bytes import validation_images_as_bytes
from tests.helpers.rfdetr_steps import assert_same_batch, on_device, rfdetr_datamodule


def loaded_batch(module, split: str = "train"):
    """The first batch of a split as the loader hands it over, with the random augmentation seeded."""
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    loader = module.train_dataloader() if split == "train" else module.val_dataloader()
    return next(iter(loader))


def test_training_batches_travel_as_bytes_and_arrive_as_rfdetrs_floats(tiny_dataset):
    expected_loaded = loaded_batch(rfdetr_datamodule(tiny_dataset))
    expected = on_device(rfdetr_datamodule(tiny_dataset), expected_loaded)
    with images_as_bytes():
        module = rfdetr_datamodule(tiny_dataset)
        loaded = loaded_batch(module)
        # what crosses from the workers is a quarter of the bytes
        assert loaded[0].tensors.dtype == torch.uint8
        assert loaded[0].tensors.nbytes * 4 == expected_loaded[0].tensors.nbytes
        ours = on_device(module, loaded)
    assert_same_batch(ours, expected)


def test_validation_keeps_rfdetrs_pipeline(tiny_dataset):
    expected = loaded_batch(rfdetr_datamodule(tiny_dataset), "val")
    with images_as_bytes():
        loaded = loaded_batch(rfdetr_datamodule(tiny_dataset), "val")
    assert loaded[0].tensors.dtype == torch.float32
    assert torch.equal(loaded[0].tensors, expected[0].tensors)


def test_validation_batches_travel_as_bytes_and_arrive_as_rfdetrs_floats(tiny_dataset):
    expected_loaded = loaded_batch(rfdetr_datamodule(tiny_dataset), "val")
    expected = on_device(rfdetr_datamodule(tiny_dataset), expected_loaded)
    with validation_images_as_bytes():
        module = rfdetr_datamodule(tiny_dataset)
        loaded = loaded_batch(module, "val")
        assert loaded[0].tensors.dtype == torch.uint8
        assert loaded[0].tensors.nbytes * 4 == expected_loaded[0].tensors.nbytes
        ours = on_device(module, loaded)
        training = loaded_batch(module)  # the training set keeps rfdetr's pipeline
    assert training[0].tensors.dtype == torch.float32
    assert_same_batch(ours, expected)


def test_both_sets_as_bytes_share_one_conversion_and_rfdetrs_hook_comes_back(tiny_dataset):
    from rfdetr.training.module_data import RFDETRDataModule

    rfdetrs_hook = RFDETRDataModule.on_after_batch_transfer
    expected = {
        split: on_device(rfdetr_datamodule(tiny_dataset), loaded_batch(rfdetr_datamodule(tiny_dataset), split))
        for split in ("train", "val")
    }
    with images_as_bytes() as for_training, validation_images_as_bytes() as for_validation:
        assert for_training is for_validation
        assert RFDETRDataModule.on_after_batch_transfer.device_normalize is for_training
        module = rfdetr_datamodule(tiny_dataset)
        loaded = {split: loaded_batch(module, split) for split in ("train", "val")}
        assert all(batch[0].tensors.dtype == torch.uint8 for batch in loaded.values())
        ours = {split: on_device(module, batch) for split, batch in loaded.items()}
    assert RFDETRDataModule.on_after_batch_transfer is rfdetrs_hook
    for split in ("train", "val"):
        assert_same_batch(ours[split], expected[split])


def test_padding_is_zero_after_normalising_as_rfdetr_pads():
    """rfdetr pads after normalising; bytes are padded before, so the padding is set to zero again."""
    from rfdetr.datasets.transforms import Normalize
    from rfdetr.utilities.tensors import nested_tensor_from_tensor_list
    from torchvision.transforms.v2 import ToDtype

    generator = torch.Generator().manual_seed(3)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in [(64, 48), (40, 64)]]
    normalize, to_float = Normalize(), ToDtype(torch.float32, scale=True)
    expected = nested_tensor_from_tensor_list([normalize(to_float(image))[0] for image in images], block_size=32)
    device_normalize = DeviceNormalize()
    device_normalize.remember(RelativeTargets(normalize))
    ours = device_normalize(nested_tensor_from_tensor_list(images, block_size=32))
    assert bool(ours.mask.any()), "the two sizes should need padding"
    assert torch.equal(ours.mask, expected.mask)
    assert torch.equal(ours.tensors, expected.tensors)


def test_pipelines_that_do_not_end_in_rfdetrs_normalisation_are_left_alone():
    from rfdetr.datasets._torchvision import Compose
    from torchvision.transforms.v2 import ToDtype, ToImage

    gpu_augmented = Compose([ToImage(), ToDtype(torch.float32, scale=True)])  # rfdetr's Kornia path normalises later
    assert bytes_pipeline(gpu_augmented) is None
    assert len(gpu_augmented.transforms) == 2


def test_a_bytes_batch_without_a_changed_pipeline_is_an_error():
    from rfdetr.utilities.tensors import nested_tensor_from_tensor_list

    batch = nested_tensor_from_tensor_list([torch.zeros(3, 8, 8, dtype=torch.uint8)])
    with pytest.raises(RuntimeError, match="no pipeline was changed"):
        DeviceNormalize()(batch)


@pytest.mark.gpu
@pytest.mark.parametrize("split", ["train", "val"])
def test_on_the_gpu_the_floats_equal_rfdetrs_and_nothing_waits(tiny_dataset, split):
    expected = on_device(rfdetr_datamodule(tiny_dataset), loaded_batch(rfdetr_datamodule(tiny_dataset), split))
    with images_as_bytes(), validation_images_as_bytes():
        module = rfdetr_datamodule(tiny_dataset)
        loaded = loaded_batch(module, split)
        assert loaded[0].tensors.dtype == torch.uint8
        on_device(module, loaded, "cuda")  # the first batch sends mean and std
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            ours = on_device(module, loaded, "cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    images, targets = ours
    assert images.tensors.device.type == "cuda"
    cpu = (images.to("cpu"), [{key: value.cpu() for key, value in target.items()} for target in targets])
    assert_same_batch(cpu, expected)

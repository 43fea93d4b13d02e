"""The resize_in_torch speedup: rfdetr's training pipeline on uint8 tensors, so torch resizes instead of Pillow.

Not rfdetr's values: the boxes are rfdetr's, the pixels within 2 levels of Pillow's; validation keeps rfdetr's
pipeline. Images of COCO's sizes (bench/synth_coco.py), so every image is really resized."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rfdetr_coco_pipeline.hooks import CHECKED_RFDETR, applied, select_speedups
from tests.helpers.rfdetr_steps import rfdetr_datamodule

REPO = Path(__file__).resolve().parents[1]
IMAGES = 6


@pytest.fixture(scope="module")
def coco_sized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coco_sized") / "coco"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "synth_coco.py"), str(root), str(IMAGES), "2", "--detail", "coco"],
        check=True,
        capture_output=True,
    )
    return root


def samples(module, split: str) -> list:
    """Each image of a split as the loader's worker makes it, with the same random draws for every pipeline."""
    dataset = (module.train_dataloader() if split == "train" else module.val_dataloader()).dataset
    made = []
    for index in range(len(dataset)):
        random.seed(index)
        torch.manual_seed(index)
        made.append(dataset[index])
    return made


def multi_scale_datamodule(dataset: Path):
    """rfdetr's data module with multi-scale training: its random choice of resizes, crops and sizes."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_data import RFDETRDataModule

    train_config = TrainConfig(
        dataset_file="coco", dataset_dir=str(dataset), batch_size=2, num_workers=0, multi_scale=True
    )
    module = RFDETRDataModule(RFDETRNanoConfig(pretrain_weights=None), train_config)
    module.setup("fit")
    return module


@pytest.mark.parametrize("make_module", [rfdetr_datamodule, multi_scale_datamodule], ids=["recipe", "multi_scale"])
def test_training_images_keep_rfdetrs_boxes_and_come_within_two_levels_of_its_pixels(coco_sized, make_module):
    from torchvision.transforms.v2 import ToImage

    # uint8 on both sides (images_as_bytes, as the GPU routes train), so pixels compare in levels of 255
    with applied(select_speedups(["images_as_bytes"], CHECKED_RFDETR)):
        pillow = make_module(coco_sized)
        expected = samples(pillow, "train")
    with applied(select_speedups(["images_as_bytes", "resize_in_torch"], CHECKED_RFDETR)):
        tensors = make_module(coco_sized)
        ours = samples(tensors, "train")
    assert isinstance(tensors._dataset_train._transforms.transforms[0], ToImage)
    assert not isinstance(pillow._dataset_train._transforms.transforms[0], ToImage)
    assert len(ours) == len(expected) == IMAGES
    largest = 0
    for (image, target), (expected_image, expected_target) in zip(ours, expected, strict=True):
        assert image.dtype == expected_image.dtype == torch.uint8
        assert image.shape == expected_image.shape
        assert torch.equal(target["boxes"], expected_target["boxes"])
        assert torch.equal(target["labels"], expected_target["labels"])
        largest = max(largest, (image.int() - expected_image.int()).abs().max().item())
    # torch's uint8 resize is not Pillow's: its pixels differ, by 2 levels at most
    assert 1 <= largest <= 2


def test_validation_keeps_rfdetrs_pipeline_and_rfdetrs_code_comes_back(coco_sized):
    from rfdetr.datasets import coco

    rfdetrs_route = coco._route_transforms
    expected = samples(rfdetr_datamodule(coco_sized), "val")
    with applied(select_speedups(["resize_in_torch"], CHECKED_RFDETR)):
        assert coco._route_transforms is not rfdetrs_route
        ours = samples(rfdetr_datamodule(coco_sized), "val")
    assert coco._route_transforms is rfdetrs_route
    for (image, target), (expected_image, expected_target) in zip(ours, expected, strict=True):
        assert torch.equal(image, expected_image)
        assert torch.equal(target["boxes"], expected_target["boxes"])


@pytest.mark.slow
def test_the_train_stage_named_it_trains_with_loader_workers_and_says_so(workdir, server, archives):
    """Through snakemake, as a user names it: the loader's worker processes get the changed pipeline."""
    from rfdetr_coco_pipeline.hooks import NAMES
    from tests.helpers.workflow import run_snakemake, tiny_config, write_config

    speedups = ["images_as_bytes", "resize_in_torch"]
    config = tiny_config(workdir, server.url, archives, epochs=1, speedups=speedups, max_workers=2)
    write_config(workdir, config)
    result = run_snakemake(workdir, "results/train/block_01/checkpoint.ckpt")
    assert result.returncode == 0, result.stdout[-5000:]
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert f"Speedups applied (2 of {len(NAMES)}): images_as_bytes, resize_in_torch" in log
    checkpoint = torch.load(workdir / "results" / "train" / "block_01" / "checkpoint.ckpt", weights_only=False)
    assert checkpoint["epoch"] == 0 and checkpoint["global_step"] > 0

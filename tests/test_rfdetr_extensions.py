"""What every extension of rfdetr's private parts shares (scripts/common.py: patch_rfdetr): it replaces one rfdetr
function or method inside its block only, and refuses an rfdetr version other than the one it was checked against."""

from __future__ import annotations

import pkgutil

import pytest

from scripts import common
from scripts.common import StageError
from scripts.deformable_sampling import deformable_sampling
from scripts.ema_without_waiting import ema_without_waiting
from scripts.gather_matched_targets import gather_matched_targets
from scripts.images_as_bytes import images_as_bytes
from scripts.lr_log_on_device import lr_log_on_device
from scripts.matches_on_device import matches_on_device
from scripts.matching_without_waiting import matching_without_waiting
from scripts.nice_loader_workers import nice_loader_workers
from scripts.padding_in_one_copy import padding_in_one_copy
from scripts.targets_one_copy import targets_one_copy
from scripts.train import extra_callbacks

EXTENSIONS = [  # (the block, what it replaces)
    (targets_one_copy, "rfdetr.utilities.tensors:PackedTargets", "to_list"),
    (matches_on_device, "rfdetr.models._assignment", "assign_many_bucketed"),
    (gather_matched_targets, "rfdetr.models.criterion:SetCriterion", "_get_matched_targets"),
    (ema_without_waiting, "rfdetr.training.callbacks.ema:RFDETREMACallback", "_update_ema_for_step"),
    (matching_without_waiting, "rfdetr.models.matcher:HungarianMatcher", "_match_many"),
    (matching_without_waiting, "rfdetr.models.criterion:SetCriterion", "num_boxes_for_targets"),
    (lr_log_on_device, "rfdetr.training.module_model:RFDETRModelModule", "_log_learning_rates"),
    (lambda: nice_loader_workers(10), "rfdetr.training.module_data", "_worker_init_fn"),
    (images_as_bytes, "rfdetr.datasets.coco", "_route_transforms"),
    (deformable_sampling, "rfdetr.models.ops.functions.ms_deform_attn_func", "_bilinear_grid_sample"),
    (padding_in_one_copy, "rfdetr.models.matcher", "pad_sequence"),
    (images_as_bytes, "rfdetr.training.module_data:RFDETRDataModule", "on_after_batch_transfer"),
    (lambda: extra_callbacks([]), "rfdetr.training", "build_trainer"),
]
NAMES = [name.strip("_") for _, _, name in EXTENSIONS]


@pytest.mark.parametrize(("block", "owner", "name"), EXTENSIONS, ids=NAMES)
def test_rfdetrs_code_is_replaced_inside_the_block_and_restored_after(block, owner, name):
    target = pkgutil.resolve_name(owner)
    original = getattr(target, name)
    with block():
        assert getattr(target, name) is not original
    assert getattr(target, name) is original


@pytest.mark.parametrize(("block", "owner", "name"), EXTENSIONS, ids=NAMES)
def test_another_rfdetr_version_is_refused_with_what_to_do(monkeypatch, block, owner, name):
    target = pkgutil.resolve_name(owner)
    original = getattr(target, name)
    monkeypatch.setattr(common, "SUPPORTED_RFDETR", "0.0.1")
    with pytest.raises(StageError, match=r"rfdetr==0\.0\.1"):
        with block():
            pass
    assert getattr(target, name) is original  # nothing was replaced

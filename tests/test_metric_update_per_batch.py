"""`metric_update_per_batch` gives rfdetr's COCO metric the state and the result rfdetr's own per-image path gives.

The batches come from `tests/test_validation_metrics.py::batch` (detections around the ground truth, crowd boxes,
tied scores) and `targets_as_the_loader_gives_them` (normalised cxcywh boxes, images without boxes, crowd regions).
"""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches.metric_inputs_in_one_copy import metric_inputs_in_one_copy
from rfdetr_coco_pipeline.hooks.patches.metric_update_per_batch import metric_update_per_batch
from tests.test_validation_metrics import batch, crowd_regions, new_metric, targets_as_the_loader_gives_them

STATES = (
    "detection_box",
    "detection_scores",
    "detection_labels",
    "groundtruth_box",
    "groundtruth_labels",
    "groundtruth_crowds",
    "groundtruth_area",
)


def batches(device: str) -> list[tuple[list[dict], list[dict]]]:
    generator = torch.Generator().manual_seed(7)
    found = []
    for images in (6, 1, 9):
        preds, targets = batch(generator, images)
        for target in targets:
            target["area"] = (target["boxes"][:, 2:] - target["boxes"][:, :2]).prod(1)
        targets[0] = {key: value[:0] for key, value in targets[0].items()}  # an image without ground truth
        preds[-1] = {key: value[:0] for key, value in preds[-1].items()}  # one without detections
        found.append(
            (
                [{key: value.to(device) for key, value in item.items()} for item in preds],
                [{key: value.to(device) for key, value in item.items()} for item in targets],
            )
        )
    return found


def assert_same_states(ours, rfdetrs) -> None:
    for name in STATES:
        theirs, mine = getattr(rfdetrs, name), getattr(ours, name)
        assert len(mine) == len(theirs) == 16, name
        for their_value, my_value in zip(theirs, mine, strict=True):
            assert my_value.device.type == "cpu" and my_value.dtype == their_value.dtype, name
            assert my_value.shape == their_value.shape and torch.equal(my_value, their_value), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_metrics_state_and_result_equal_rfdetrs_bit_for_bit(device):
    """Three batches (with an image without ground truth and one without detections) through rfdetr's metric, stock
    and within the block: every state tensor and every computed number are equal."""
    rfdetrs, ours = new_metric(), None
    for preds, targets in batches(device):
        rfdetrs.update(preds, targets)
    with metric_update_per_batch():
        ours = new_metric()
        for preds, targets in batches(device):
            ours.update(preds, targets)
    assert_same_states(ours, rfdetrs)
    theirs, mine = rfdetrs.compute(), ours.compute()
    assert theirs.keys() == mine.keys()
    assert float(theirs["map"]) > 0.005  # some detections hit: a metric with something to agree on
    for key, value in theirs.items():
        assert torch.equal(torch.as_tensor(mine[key]), torch.as_tensor(value)), key


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("one_copy", [False, True], ids=["alone", "with_metric_inputs_in_one_copy"])
def test_targets_converted_per_batch_equal_rfdetrs_conversion(device, one_copy):
    """rfdetr converts each image's targets on its own; within the block the batch's boxes are converted together.
    Images without boxes, crowd regions for some images, alone and under `metric_inputs_in_one_copy`."""
    from contextlib import ExitStack

    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback

    callback = COCOEvalCallback.__new__(COCOEvalCallback)  # the conversion reads nothing of the callback's state
    crowds = crowd_regions()
    targets = targets_as_the_loader_gives_them(device)
    rfdetrs = callback._convert_targets(targets, crowd_regions=crowds)
    with ExitStack() as stack:
        stack.enter_context(metric_update_per_batch())
        if one_copy:
            stack.enter_context(metric_inputs_in_one_copy())
        ours = callback._convert_targets(targets, crowd_regions=crowds)
    assert sum(len(entry["boxes"]) for entry in rfdetrs) == sum(index % 5 for index in range(16)) + 2
    assert len(ours) == len(rfdetrs)
    for theirs, mine in zip(rfdetrs, ours, strict=True):
        assert theirs.keys() == mine.keys()
        for key, value in theirs.items():
            assert mine[key].dtype == value.dtype, key
            assert mine[key].device.type == ("cpu" if one_copy else value.device.type), key
            assert torch.equal(mine[key].cpu(), value.cpu()), key  # bit for bit


def test_masks_and_other_box_formats_keep_rfdetrs_path():
    """What the block does not convert per batch goes through rfdetr's own code unchanged."""
    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback
    from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision

    callback = COCOEvalCallback.__new__(COCOEvalCallback)
    targets = targets_as_the_loader_gives_them("cpu")[:3]
    for target in targets:
        target["masks"] = torch.zeros(len(target["boxes"]), 8, 8, dtype=torch.bool)
    with metric_update_per_batch():
        converted = callback._convert_targets(targets)
        xywh = OnePassCocoMeanAveragePrecision(iou_type="bbox", box_format="xywh")
        preds, truth = batch(torch.Generator().manual_seed(2), 2)
        xywh.update(preds, truth)
    assert all("masks" in entry for entry in converted)  # rfdetr's path resizes them; ours would have dropped them
    assert torch.equal(xywh.detection_box[0], preds[0]["boxes"])  # not converted: the boxes are xywh already

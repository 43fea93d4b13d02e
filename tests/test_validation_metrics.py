"""The validation speedups `metric_update_per_batch`, `metric_inputs_in_one_copy` and `matching_in_workers` give
rfdetr's metrics.

The first test feeds rfdetr's matching directly, three batches with many true and false matches, crowd boxes and
tied scores; the second runs rfdetr's real evaluation loop on the tiny set with and without both speedups.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

from rfdetr_coco_pipeline.hooks import CHECKED_RFDETR, applied, select_speedups
from rfdetr_coco_pipeline.hooks.coco_metrics import captured_coco_metrics
from rfdetr_coco_pipeline.hooks.patches.matching_in_workers import (
    MatchingPool,
    PendingAccumulator,
    matching_in_workers,
    settle,
)
from rfdetr_coco_pipeline.hooks.patches.metric_inputs_in_one_copy import to_host_in_one_copy
from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

SPEEDUPS = ["metric_update_per_batch", "metric_inputs_in_one_copy", "matching_in_workers"]


def batch(generator: torch.Generator, images: int) -> tuple[list[dict], list[dict]]:
    """Detections scattered around the ground truth (some on it, some off), over few classes, some scores tied."""
    preds, targets = [], []
    for _ in range(images):
        gt = torch.rand(5, 2, generator=generator) * 200
        gt_boxes = torch.cat([gt, gt + 20 + torch.rand(5, 2, generator=generator) * 80], dim=1)
        near = gt_boxes.repeat(6, 1) + torch.randn(30, 4, generator=generator) * 12
        boxes = torch.cat([near, torch.rand(20, 4, generator=generator).sort(dim=1).values * 300])
        scores = (torch.rand(50, generator=generator) * 20).round() / 20  # ties
        preds.append({"boxes": boxes, "scores": scores, "labels": torch.randint(0, 4, (50,), generator=generator)})
        targets.append(
            {
                "boxes": gt_boxes,
                "labels": torch.randint(0, 4, (5,), generator=generator),
                "iscrowd": (torch.rand(5, generator=generator) < 0.2).long(),
            }
        )
    return preds, targets


def assert_same_accumulator(ours: dict, rfdetrs: dict) -> None:
    assert sorted(ours) == sorted(rfdetrs)
    for class_id, entry in rfdetrs.items():
        assert ours[class_id]["total_gt"] == entry["total_gt"]
        for key in ("scores", "matches", "ignore"):
            assert ours[class_id][key].dtype == entry[key].dtype
            assert np.array_equal(ours[class_id][key], entry[key]), (class_id, key)


def test_matching_in_workers_gives_rfdetrs_accumulator_array_for_array():
    from rfdetr.evaluation.matching import build_matching_data, merge_matching_data
    from rfdetr.training.callbacks import coco_eval

    generator = torch.Generator().manual_seed(0)
    batches = [batch(generator, 12) for _ in range(3)]
    rfdetrs: dict = {}
    for preds, targets in batches:
        merge_matching_data(rfdetrs, build_matching_data(preds, targets))
    assert sum(int(entry["matches"].sum()) for entry in rfdetrs.values()) > 20  # true matches to compare
    assert sum(int(entry["ignore"].sum()) for entry in rfdetrs.values()) > 0  # crowd matches too

    with matching_in_workers():
        ours = coco_eval.init_matching_accumulator()
        assert isinstance(ours, PendingAccumulator)
        for preds, targets in batches:
            coco_eval.merge_matching_data(ours, coco_eval.build_matching_data(preds, targets))
        assert len(ours.pending) == 3 and not dict(ours)  # nothing matched on this process yet
        settle(ours, merge_matching_data)  # what the accumulator's reader does first, in the batches' order
    assert_same_accumulator(ours, rfdetrs)
    assert coco_eval.build_matching_data is build_matching_data  # rfdetr's own again after the block


def items_of_several_dtypes(device: str) -> list[dict]:
    items = [
        {"boxes": torch.rand(3, 4, dtype=torch.float64), "labels": torch.arange(3), "size": torch.tensor([4, 5])},
        {"boxes": torch.rand(0, 4, dtype=torch.float64), "labels": torch.arange(0), "name": "not a tensor"},
        {"boxes": torch.rand(2, 4).bfloat16(), "labels": torch.arange(2), "size": torch.tensor([[1], [2]])},
    ]
    return [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in item.items()} for item in items]


def test_host_tensors_are_handed_through_untouched():
    items = items_of_several_dtypes("cpu")
    moved = to_host_in_one_copy(items)
    assert all(moved[i][key] is value for i, item in enumerate(items) for key, value in item.items())


@pytest.mark.gpu
def test_one_copy_per_dtype_keeps_every_tensors_values_dtype_and_shape():
    items = items_of_several_dtypes("cuda")
    moved = to_host_in_one_copy(items)
    for before, after in zip(items, moved, strict=True):
        assert before.keys() == after.keys()
        for key, value in before.items():
            if isinstance(value, torch.Tensor):
                assert after[key].device.type == "cpu" and after[key].dtype == value.dtype
                assert after[key].shape == value.shape and torch.equal(after[key], value.cpu())
            else:
                assert after[key] == value
    float64_storages = {after["boxes"].untyped_storage().data_ptr() for after in moved[:2]}
    assert len(float64_storages) == 1  # one copy for every float64 tensor of the batch


@pytest.mark.slow
def test_validation_metrics_equal_rfdetrs_with_the_validation_speedups(tmp_path):
    """rfdetr's evaluation loop (the test loop of `evaluate()`: the same callback hooks as validation) on 48 tiny
    images, stock and with both speedups: the COCO metric, the F1 accumulator and every returned number are equal.
    An untrained model's boxes are empty, so every detection is a miss here; the test above has true matches."""
    from rfdetr import RFDETRNano

    from tests.helpers.tiny_coco import make_split

    dataset = tmp_path / "tiny"
    make_split(dataset, "val2017", 48, seed=3)

    def evaluate(speedups: list[str]) -> tuple[dict, list, list]:
        accumulators: list = []

        def keep_accumulator(original):
            def compute_and_log_f1_metrics(callback, trainer, module, split, f1_local):
                result = original(callback, trainer, module, split, f1_local)
                accumulators.append((type(f1_local), copy.deepcopy(dict(f1_local))))  # settled by now
                return result

            return compute_and_log_f1_metrics

        torch.manual_seed(0)
        model = RFDETRNano(pretrain_weights=None, resolution=64)
        with (
            applied(select_speedups(speedups or "none", CHECKED_RFDETR)),
            patch_rfdetr(
                "rfdetr.training.callbacks.coco_eval:COCOEvalCallback", "_compute_and_log_f1_metrics", keep_accumulator
            ),
            captured_coco_metrics() as computed,
            tempfile.TemporaryDirectory() as scratch,
        ):
            returned = model.evaluate(
                split="val",
                dataset_file="coco",
                dataset_dir=str(dataset),
                output_dir=scratch,
                batch_size=8,
                eval_batch_size=8,
                num_workers=0,
                device="cpu",
                progress_bar=None,
                eval_max_dets=500,
            )
        return returned, computed, accumulators

    stock_returned, stock_computed, stock_accumulators = evaluate([])
    ours_returned, ours_computed, ours_accumulators = evaluate(SPEEDUPS)

    assert stock_returned == ours_returned
    assert len(stock_computed) == len(ours_computed) == 1
    assert stock_computed[0].keys() == ours_computed[0].keys()
    for key, value in stock_computed[0].items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(ours_computed[0][key])), key
    assert len(stock_accumulators) == len(ours_accumulators) == 1
    (stock_kind, stock_accumulator), (our_kind, our_accumulator) = stock_accumulators[0], ours_accumulators[0]
    assert stock_kind is dict and our_kind is PendingAccumulator  # ours went through the workers
    assert_same_accumulator(our_accumulator, stock_accumulator)
    assert sum(len(entry["scores"]) for entry in stock_accumulator.values()) == 48 * 300  # every detection


def test_without_cuda_state_the_workers_start_from_a_fork_server():
    """The pool's workers are forked from a clean server process, never from the training process (which holds
    CUDA state on a GPU)."""
    pool = MatchingPool(workers=1)
    try:
        preds, targets = batch(torch.Generator().manual_seed(1), 2)
        pool.submit(preds, targets, 0.5).result(timeout=120)
        assert pool.executor is not None and pool.executor._mp_context.get_start_method() == "forkserver"
    finally:
        pool.close()
    assert pool.executor is None


def test_the_fork_server_starts_with_the_block_before_any_batch():
    """Entering the block starts the fork server (its import of rfdetr then runs while training goes on); no worker
    starts before the first batch. In a fresh process, where no fork server runs yet."""
    code = """
import multiprocessing.forkserver as forkserver
from rfdetr_coco_pipeline.hooks.patches.matching_in_workers import matching_in_workers
assert forkserver._forkserver._forkserver_pid is None
with matching_in_workers():
    assert forkserver._forkserver._forkserver_pid is not None, "no fork server after the block's entry"
    assert forkserver._forkserver._preload_modules == ["rfdetr.evaluation.matching"]
print("fork server started with the block")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "fork server started with the block" in done.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("score_dtype", [torch.float32, torch.bfloat16])
def test_on_the_gpu_matching_host_copies_equals_rfdetrs_matching_of_gpu_tensors(score_dtype):
    """rfdetr matches GPU tensors (its box IoU on the GPU); the speedups match host copies in the workers."""
    from rfdetr.evaluation.matching import build_matching_data, merge_matching_data
    from rfdetr.training.callbacks import coco_eval

    generator = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(4):
        preds, targets = batch(generator, 32)
        for pred in preds:
            pred["scores"] = pred["scores"].to(score_dtype)
        batches.append(([to_cuda(p) for p in preds], [to_cuda(t) for t in targets]))
    rfdetrs: dict = {}
    for preds, targets in batches:
        merge_matching_data(rfdetrs, build_matching_data(preds, targets))
    with matching_in_workers():
        ours = coco_eval.init_matching_accumulator()
        for preds, targets in batches:
            coco_eval.merge_matching_data(
                ours, coco_eval.build_matching_data(to_host_in_one_copy(preds), to_host_in_one_copy(targets))
            )
        settle(ours, merge_matching_data)
    assert sum(int(entry["matches"].sum()) for entry in rfdetrs.values()) > 50
    assert_same_accumulator(ours, rfdetrs)


def to_cuda(item: dict) -> dict:
    return {key: value.cuda() for key, value in item.items()}


def targets_as_the_loader_gives_them(device: str) -> list[dict]:
    """A batch's targets as they reach the metric callback: normalised cxcywh boxes, on the batch's device."""
    generator = torch.Generator().manual_seed(4)
    targets = []
    for index in range(16):
        count = index % 5  # 0 (an image without boxes) to 4
        centre = torch.rand(count, 2, generator=generator) * 0.6 + 0.2
        size = torch.rand(count, 2, generator=generator) * 0.3 + 0.01
        target = {
            "boxes": torch.cat([centre, size], 1),
            "labels": torch.randint(0, 80, (count,), generator=generator),
            "iscrowd": torch.zeros(count, dtype=torch.long),
            "area": torch.rand(count, generator=generator) * 5000,
            "orig_size": torch.tensor([333 + 7 * index, 500 - 3 * index]),
            "size": torch.tensor([384, 384]),
            "image_id": torch.tensor(1000 + index),
        }
        targets.append({key: value.to(device) for key, value in target.items()})
    return targets


def crowd_regions() -> dict:
    """Crowd regions for two of `targets_as_the_loader_gives_them`'s images, as rfdetr reads COCO's crowds."""
    from rfdetr.datasets.coco import CrowdRegion

    return {
        1003: [CrowdRegion(7, (10.5, 20.25, 80.0, 99.75), None)],
        1008: [CrowdRegion(1, (0.0, 0.0, 5.0, 5.0), None)],
    }


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_targets_converted_on_the_host_equal_rfdetrs_conversion_on_the_batchs_device(device):
    """rfdetr converts a batch's targets on their device; with `metric_inputs_in_one_copy` they are copied to the host
    first and converted there. Crowd regions are appended for some images, as rfdetr does for COCO's crowds."""
    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback

    from rfdetr_coco_pipeline.hooks.patches.metric_inputs_in_one_copy import metric_inputs_in_one_copy

    callback = COCOEvalCallback.__new__(COCOEvalCallback)  # the conversion reads nothing of the callback's state
    crowds = crowd_regions()
    targets = targets_as_the_loader_gives_them(device)
    rfdetrs = callback._convert_targets(targets, crowd_regions=crowds)
    with metric_inputs_in_one_copy():
        ours = callback._convert_targets(targets, crowd_regions=crowds)
    assert len(ours) == len(rfdetrs) == 16
    assert sum(len(entry["boxes"]) for entry in rfdetrs) == sum(index % 5 for index in range(16)) + 2
    for theirs, mine in zip(rfdetrs, ours, strict=True):
        assert theirs.keys() == mine.keys()
        for key, value in theirs.items():
            assert mine[key].device.type == "cpu" and mine[key].dtype == value.dtype, key
            assert torch.equal(mine[key], value.cpu()), key  # bit for bit


def new_metric():
    """rfdetr's COCO metric as its validation callback builds it (vernier, 500 detections at most)."""
    from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision

    return OnePassCocoMeanAveragePrecision(
        iou_type="bbox", class_metrics=True, max_detection_thresholds=[1, 10, 500], backend="vernier"
    )


def batches_as_one_copy_leaves_them() -> list[tuple[list[dict], list[dict]]]:
    """Four batches whose boxes and scores are views of one host buffer per batch and field, as
    `metric_inputs_in_one_copy` hands them to the metric after one copy from the GPU."""
    generator = torch.Generator().manual_seed(11)
    found = []
    for _ in range(4):
        preds, targets = batch(generator, 40)
        for key in ("boxes", "scores"):
            flat = torch.cat([item[key].reshape(-1) for item in preds])
            pieces = flat.split([item[key].numel() for item in preds])
            for item, piece in zip(preds, pieces, strict=True):
                item[key] = piece.view(item[key].shape)
        found.append((preds, targets))
    return found


def merge_on_a_rank(rank: int, address: str, folder: str, speedups: list[str]) -> None:
    """One of two DDP ranks (gloo): its half of the batches, rfdetr's state merge, the metric computed."""
    import pickle
    from pathlib import Path

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    gathered_bytes: list[int] = []

    def measured(original):
        def all_gather(data, *args, **kwargs):
            gathered_bytes.append(len(pickle.dumps(data)))
            return original(data, *args, **kwargs)

        return all_gather

    try:
        with (
            applied(select_speedups(speedups or "none", CHECKED_RFDETR)),
            patch_rfdetr("rfdetr.training.coco_map", "all_gather", measured),
        ):
            metric = new_metric()
            for preds, targets in batches_as_one_copy_leaves_them()[2 * rank : 2 * rank + 2]:
                metric.update(preds, targets)
            metric.merge_distributed_state()
            result = metric.compute()
        torch.save(
            {"result": result, "gathered_bytes": sum(gathered_bytes)}, Path(folder) / f"{bool(speedups)}-{rank}.pt"
        )
    finally:
        dist.destroy_process_group()


def test_two_ddp_ranks_merge_to_one_processs_metrics_sending_each_images_values_only(tmp_path):
    """Two real DDP ranks (gloo on the CPU), each with half of the batches as one copy from the GPU leaves them
    (views of one buffer): after rfdetr's `merge_distributed_state` both ranks compute the metrics one process
    computes over every batch, stock and with the speedups that reach the metric; with them a rank sends each
    image's values, where rfdetr's merge pickles every view with its whole buffer."""
    import socket

    import torch.multiprocessing as mp

    one_process = new_metric()
    for preds, targets in batches_as_one_copy_leaves_them():
        one_process.update(preds, targets)
    expected = one_process.compute()
    for speedups in ([], ["metric_update_per_batch", "metric_inputs_in_one_copy"]):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(merge_on_a_rank, args=(f"tcp://127.0.0.1:{port}", str(tmp_path), speedups), nprocs=2)
    saved = {(ours, rank): torch.load(tmp_path / f"{ours}-{rank}.pt") for ours in (False, True) for rank in (0, 1)}
    for (ours, rank), found in saved.items():
        assert found["result"].keys() == expected.keys(), (ours, rank)
        for key, value in expected.items():
            assert torch.equal(torch.as_tensor(found["result"][key]), torch.as_tensor(value)), (ours, rank, key)
    for rank in (0, 1):
        assert saved[(False, rank)]["gathered_bytes"] > 3 * saved[(True, rank)]["gathered_bytes"]

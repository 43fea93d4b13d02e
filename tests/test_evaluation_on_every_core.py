"""The evaluation_on_every_core speedup: rfdetr's COCO evaluation gets every core of the rank, with the same metrics."""

from __future__ import annotations

import os

import pytest
import torch

from bench.synth_detections import validation_batch
from rfdetr_coco_pipeline.hooks.patches.evaluation_on_every_core import evaluation_on_every_core


def evaluated(batches: int = 3) -> tuple[dict, list[int]]:
    """rfdetr's COCO metric over synthetic batches of COCO's scale, as its validation callback builds it, and the
    thread counts vernier was handed."""
    import vernier.instance
    from rfdetr.training.coco_map import OnePassCocoMeanAveragePrecision

    generator = torch.Generator().manual_seed(0)
    metric = OnePassCocoMeanAveragePrecision(
        iou_type="bbox", class_metrics=True, max_detection_thresholds=[1, 10, 500], backend="vernier"
    )
    for _ in range(batches):
        metric.update(*validation_batch(generator, images=40))
    handed: list[int] = []
    evaluate = vernier.instance.evaluate_bbox_grid

    def recording(*args, **kwargs):  # vernier's own evaluation, with the thread count it was handed noted
        handed.append(kwargs["num_threads"])
        return evaluate(*args, **kwargs)

    vernier.instance.evaluate_bbox_grid = recording
    try:
        return metric.compute(), handed
    finally:
        vernier.instance.evaluate_bbox_grid = evaluate


@pytest.fixture
def one_torch_thread():
    """torch's threads as the train stage sets them on a GPU (train.host_threads: 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_evaluation_gets_every_core_and_gives_rfdetrs_metrics(one_torch_thread):
    theirs, their_threads = evaluated()
    with evaluation_on_every_core():
        ours, our_threads = evaluated()
    assert their_threads == [1]  # rfdetr's budget follows torch's one thread
    assert our_threads == [len(os.sched_getaffinity(0))]
    assert torch.get_num_threads() == 1  # the training step's threads are left alone
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(torch.as_tensor(value), torch.as_tensor(ours[key])) for key, value in theirs.items())
    assert float(ours["map"]) > 0  # the detections overlap their truths: a real evaluation, not an empty one


def test_ranks_on_one_node_share_the_cores(monkeypatch, one_torch_thread):
    from rfdetr.training import coco_map

    cores = len(os.sched_getaffinity(0))
    with evaluation_on_every_core():
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        assert coco_map._vernier_thread_budget() == max(1, cores // 2)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 4))
        assert coco_map._vernier_thread_budget() == 1  # never none


def test_rfdetrs_budget_is_back_after_the_block(one_torch_thread):
    from rfdetr.training import coco_map

    original = coco_map._vernier_thread_budget
    with evaluation_on_every_core():
        assert coco_map._vernier_thread_budget is not original
    assert coco_map._vernier_thread_budget is original

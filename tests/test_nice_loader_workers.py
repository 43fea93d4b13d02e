"""The nice_loader_workers speedup: rfdetr's loader workers run at a lower priority, and load the same batches."""

from __future__ import annotations

import os
import pickle

import torch

from rfdetr_coco_pipeline.hooks.patches.nice_loader_workers import nice_loader_workers


class WorkerReport(torch.utils.data.Dataset):
    """Each item: its index, the niceness of the process that loaded it, and a number from NumPy's generator
    (which rfdetr's worker set-up seeds)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int, float]:
        import numpy

        return index, os.nice(0), float(numpy.random.random())


def load_with_rfdetrs_worker_setup() -> list[tuple[int, int, float]]:
    from rfdetr.training import module_data

    torch.manual_seed(7)  # the workers' seeds derive from it
    loader = torch.utils.data.DataLoader(
        WorkerReport(), batch_size=None, num_workers=2, worker_init_fn=module_data._worker_init_fn
    )
    return [tuple(item) for item in loader]


def test_workers_run_niced_and_load_the_same_items():
    plain = load_with_rfdetrs_worker_setup()
    with nice_loader_workers(5):
        niced = load_with_rfdetrs_worker_setup()
    ours = os.nice(0)
    assert {niceness for _, niceness, _ in plain} == {ours}
    assert {niceness for _, niceness, _ in niced} == {min(ours + 5, 19)}
    # the same items in the same order, with the same seeded random draws: only scheduling changed
    assert [(index, draw) for index, _, draw in niced] == [(index, draw) for index, _, draw in plain]


def test_the_worker_set_up_survives_pickling_for_spawned_workers():
    from rfdetr.training import module_data

    with nice_loader_workers(3):
        pickled = pickle.dumps(module_data._worker_init_fn)
    restored = pickle.loads(pickled)  # as in a new interpreter: rfdetr's own function under its name
    assert restored.niceness == 3 and restored.init is module_data._worker_init_fn


def test_niceness_zero_leaves_rfdetr_untouched():
    from rfdetr.training import module_data

    original = module_data._worker_init_fn
    with nice_loader_workers(0):
        assert module_data._worker_init_fn is original

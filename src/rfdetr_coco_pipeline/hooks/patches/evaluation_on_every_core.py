"""Run the COCO evaluation at each validation's end on every core the process may use, not on one.

rfdetr evaluates mAP with vernier and hands it `_vernier_thread_budget()` threads: torch's intra-op thread
count divided by the ranks on the node. On a GPU the train stage sets torch's threads to `train.host_threads` (1,
because more threads slow the training step's host work), so the evaluation of every validation ran on one thread
while the other cores waited: the largest part of the validation's end (`bench.validation`'s `epoch_end`).

Within this block `rfdetr.training.coco_map:_vernier_thread_budget` returns the cores this process may run on
(`os.sched_getaffinity`) divided by the ranks on the node (`LOCAL_WORLD_SIZE`, as rfdetr divides), at least one.
torch's own thread count, and so the training step, is left alone.

Guarantees: the metrics equal rfdetr's; vernier's results do not depend on its thread count.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def cores_per_rank() -> int:
    """The cores this process may run on, shared among the ranks on this node (at least one)."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or "1"))
    return max(1, len(os.sched_getaffinity(0)) // ranks)


def every_core(original: Callable[[], int]) -> Callable[[], int]:
    """rfdetr's thread budget, replaced: the cores of this rank, whatever torch's thread count is."""
    return cores_per_rank


def evaluation_on_every_core() -> AbstractContextManager[None]:
    """Within this block, rfdetr's COCO evaluation runs on every core of this rank (see module doc)."""
    return patch_rfdetr("rfdetr.training.coco_map", "_vernier_thread_budget", every_core)

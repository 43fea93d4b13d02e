"""Run rfdetr's data-loader workers at a lower CPU priority than the training loop.

The training loop is one Python thread that launches the GPU's work; the data loader is 16 worker processes that
decode and augment images. `nice_loader_workers(n)` lowers each worker's priority by `n` (`os.nice`) as the worker
starts, before rfdetr's own worker set-up (seeding) runs: whenever the loop is ready to run it gets a core first,
and the workers still use every core the loop leaves idle. Which images, in which order, with which augmentation,
is unchanged: only the scheduling of processes changes.

Measured on an H200 (BENCHMARKS.md, fifth session): +3.7 % images/s beside the same variant without it. It was
written for the loop's 25-40 ms pauses; those turned out not to be the scheduler's doing (the loop was taken off
its core about once in four steps) and remain. It wraps rfdetr's private `_worker_init_fn` (looked up when each
DataLoader is built), so it refuses any rfdetr version but the one it was checked against.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from scripts.common import patch_rfdetr


class NicedWorkerInit:
    """A DataLoader `worker_init_fn`: lower this worker's priority by `niceness`, then run rfdetr's `init`."""

    def __init__(self, niceness: int, init: Callable[[int], None]) -> None:
        self.niceness = niceness
        self.init = init

    def __call__(self, worker_id: int) -> None:
        os.nice(self.niceness)
        self.init(worker_id)

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        # Workers started in a new interpreter (spawn, forkserver) get this by pickling. rfdetr's function cannot be
        # pickled by name while this block has replaced it; in the new interpreter its name is rfdetr's own again.
        return niced_rfdetr_worker_init, (self.niceness,)


def niced_rfdetr_worker_init(niceness: int) -> NicedWorkerInit:
    from rfdetr.training import module_data

    return NicedWorkerInit(niceness, module_data._worker_init_fn)


def nice_loader_workers(niceness: int) -> AbstractContextManager[None]:
    """Within this block, rfdetr's data-loader workers run `niceness` steps below the training loop (0: unchanged)."""
    if niceness == 0:
        return nullcontext()
    return patch_rfdetr(
        "rfdetr.training.module_data",
        "_worker_init_fn",
        lambda init: NicedWorkerInit(niceness, init),
        "scripts/nice_loader_workers.py",
    )

"""Run rfdetr's data-loader workers at a lower CPU priority than the training loop.

The training loop is one Python thread that launches the GPU's work; the data loader is up to 16 worker processes
that decode and augment images. This wraps rfdetr's private `rfdetr.training.module_data._worker_init_fn`
(looked up when each DataLoader is built) so that each worker lowers its priority by `niceness` (`os.nice`) as it
starts, before rfdetr's own worker set-up (seeding) runs: whenever the loop is ready to run it gets a core first, and
the workers still use every core the loop leaves idle.

Guarantees: which images, in which order, with which augmentation, is unchanged (only the scheduling of processes
changes), also for workers started by spawn or forkserver. Niceness 0 leaves rfdetr untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


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


def nice_loader_workers(loader_niceness: int) -> AbstractContextManager[None]:
    """Within this block, rfdetr's loader workers run `loader_niceness` steps below the training loop (0: unchanged)."""
    if loader_niceness == 0:
        return nullcontext()
    return patch_rfdetr(
        "rfdetr.training.module_data", "_worker_init_fn", lambda init: NicedWorkerInit(loader_niceness, init)
    )

"""Keep Python's garbage collector from pausing the training loop for tens of milliseconds.

A compiled training process holds millions of long-lived Python objects (the compiled graphs, their guards, the
dataset index). Python's full collections walk all of them: on an H200 the training thread stopped for about 25 ms
once per step, at random places, while the GPU waited (BENCHMARKS.md). `gc.freeze()` moves every object alive at
that moment out of the collector's reach; objects made later are collected as usual. Freezing once per epoch,
after the first step (when the model has been compiled) and after a full collection (so no garbage is kept
forever), leaves the collector only the objects made since. Nothing about the training changes.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)


def collect_and_freeze() -> tuple[int, float]:
    """Collect what is garbage now, then freeze the rest; returns (objects frozen, seconds taken)."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), time.perf_counter() - started


def freeze_gc_callback() -> Any:
    """A Lightning callback that collects and freezes at the second training step of every epoch."""
    import pytorch_lightning as pl

    class FreezeLongLivedObjects(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, idx: int) -> None:
            if idx == 1:  # the first step compiled the model (and the last validation its own graph)
                frozen, seconds = collect_and_freeze()
                log.info("Garbage collector: %d long-lived objects frozen in %.2f s", frozen, seconds)

    return FreezeLongLivedObjects()

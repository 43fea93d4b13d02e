"""Full garbage collections leave alone the objects that live as long as the training process.

Once torch.compile, Lightning and rfdetr have built and compiled the model, the training process holds hundreds of
thousands to millions of long-lived Python objects (FX graphs, guards, kernel wrappers, the model's modules).
CPython's collector visits every one of them in each full (generation 2) collection, which it starts on its own,
every so often, in the middle of a training step: the training thread stops for the whole collection (a fraction of
a second to over a second; `python -m bench.full_collection` shows it for rfdetr's Nano), and a GPU that waits for
the host stops with it.

`gc.freeze()` moves every object the collector tracks at that moment into a permanent generation that no collection
visits. `FreezeAfterWarmup` freezes after the first steps of every epoch, when that epoch's compiling and graph
capture are done. The first freeze of a process follows a full collection, so no garbage is kept then; later ones
do not collect (a full collection is the pause this avoids), so cyclic garbage made since the previous freeze and
not yet collected is kept: at most what one epoch left behind. It replaces nothing of rfdetr's; the model's values
are untouched, only when the host frees memory changes. `FullCollections` counts the full collections, which the
epoch log records per epoch.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import pytorch_lightning as pl

FREEZE_AFTER_STEPS = 3  # the first steps of an epoch compile, capture graphs and fill the loader


class FullCollections:
    """Counts the full (generation 2) collections of this process and the seconds they take, from the moment
    `start()` is called, through `gc.callbacks`."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.count += 1
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def start(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


class FreezeAfterWarmup(pl.Callback):
    """Freezes the collector's tracked objects after `steps` steps of each epoch (see the module's text)."""

    def __init__(self, steps: int = FREEZE_AFTER_STEPS) -> None:
        self.steps = steps
        self.collected_once = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx != self.steps - 1:
            return
        if not self.collected_once:
            gc.collect()
            self.collected_once = True
        gc.freeze()

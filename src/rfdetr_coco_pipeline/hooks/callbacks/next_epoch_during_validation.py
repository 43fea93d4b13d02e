"""The loader's workers start on the next epoch's batches while the model validates.

With persistent workers (rfdetr's default) PyTorch's DataLoader hands its workers the first indices of an epoch only
when the epoch's iterator is asked for, at the start of the epoch. Every worker then decodes its first batch at the
same moment, and nothing arrives for the time one worker takes for one batch (about a second at batch 128), plus
the first steps' waits while the other batches trickle in.

`NextEpochDuringValidation` asks for the next epoch's iterator when validation starts at an epoch's end, so the
workers decode the first `prefetch_factor x workers` batches while the GPU validates. When the epoch starts,
Lightning's own request gets that iterator, already primed. It replaces the moment the training loader's workers
start on an epoch, nothing of rfdetr's. Guarantees: the same batches in the same order (the sampler draws the
epoch's order from the same random state, and Lightning sets a DDP sampler's epoch to the value set here); nothing
is done for a loader without persistent workers, after the last epoch, or when the trainer is stopping.
"""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

log = logging.getLogger(__name__)


def start_next_epoch(loader: Any, epoch: int) -> bool:
    """Reset `loader`'s persistent iterator for `epoch` now; its next `iter()` returns it without a second reset.
    False (nothing done) for a loader without persistent workers, whose iterator is made anew each epoch."""
    from lightning_fabric.utilities.data import _set_sampler_epoch

    if not (getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0):
        return False
    _set_sampler_epoch(loader, epoch)  # what Lightning's fit loop does at the epoch's start (DDP's shuffle)
    iterator = iter(loader)  # DataLoader.__iter__: the persistent iterator, reset and primed
    if getattr(loader, "_iterator", None) is not iterator or not hasattr(iterator, "_reset"):
        raise RuntimeError(
            f"{__name__} was written for torch's DataLoader that keeps one iterator per loader with persistent "
            "workers and resets it on iter(); this torch does otherwise. Leave the speedup "
            "next_epoch_during_validation out of train.speedups (config.yaml), or adapt it."
        )

    def already_reset(loader: Any, first_iter: bool = False) -> None:
        del iterator._reset  # later epochs reset as usual

    iterator._reset = already_reset
    return True


class NextEpochDuringValidation(pl.Callback):
    """When validation starts at an epoch's end, the training loader starts the next epoch (module's text)."""

    def __init__(self) -> None:
        self.started_early = 0  # epochs whose loading began during the previous validation

    def on_validation_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        next_epoch = trainer.current_epoch + 1
        last_epoch = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= next_epoch
        # Only at an epoch's end (not a validation in mid-epoch), and only when another epoch follows.
        if not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or last_epoch or trainer.should_stop:
            return
        if start_next_epoch(trainer.train_dataloader, next_epoch):
            self.started_early += 1
            log.info("Epoch %d: the loader's workers start on it during this validation", next_epoch)

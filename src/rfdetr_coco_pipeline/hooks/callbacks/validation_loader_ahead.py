"""The validation loader's workers start on the validation's batches during the training epoch's last steps.

With persistent workers (rfdetr's default) the validation loader's workers get their first indices only when
validation asks for its iterator, after the epoch's last training step. Every worker then decodes its first batch
at the same moment, and the validation waits that long for its first batch, then for the batches the workers could
not keep ahead of.

By the epoch's last `prefetch_factor x workers` training steps, the training loader's sampler is used up: its
workers only finish the batches they already hold, and the cores go idle. `ValidationLoaderAhead` then asks for the
validation loader's iterator, so its workers decode the first `prefetch_factor x workers` validation batches
while the last training steps run. When validation starts, Lightning's own request gets that iterator, already
primed. It replaces the moment the validation loader's workers start, nothing of rfdetr's. Guarantees: the same
batches in the same order (the validation sampler is sequential); nothing is done for a loader without persistent
workers, before an epoch whose end does not validate, or when the trainer is stopping.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from rfdetr_coco_pipeline.hooks.callbacks.next_epoch_during_validation import start_next_epoch

log = logging.getLogger(__name__)


def batches_in_flight(loader: Any) -> int:
    """How many batches a loader's workers hold at most: what is still to come once its sampler is used up."""
    workers = getattr(loader, "num_workers", 0)
    return (getattr(loader, "prefetch_factor", None) or 2) * workers if workers > 0 else 0


def validates_after(trainer: pl.Trainer) -> bool:
    """Whether validation runs at the end of the current training epoch (every `check_val_every_n_epoch` epochs,
    at the epoch's end: rfdetr's schedule)."""
    every = trainer.check_val_every_n_epoch
    return trainer.limit_val_batches != 0 and (every is None or (trainer.current_epoch + 1) % every == 0)


class ValidationLoaderAhead(pl.Callback):
    """During an epoch's last training steps, the validation loader starts on its batches (module's text)."""

    def __init__(self) -> None:
        self.started_early: list[int] = []  # the epochs whose validation loading began during their training
        self.looked_at: int | None = None  # the last epoch whose end this callback has dealt with

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        epoch = trainer.current_epoch
        if trainer.state.fn != TrainerFn.FITTING or trainer.should_stop or self.looked_at == epoch:
            return
        total = trainer.num_training_batches
        if not math.isfinite(total) or batch_idx + 1 < total - batches_in_flight(trainer.train_dataloader):
            return
        self.looked_at = epoch
        if not validates_after(trainer):
            return
        val_loop = getattr(trainer.fit_loop.epoch_loop, "val_loop", None)
        if not callable(getattr(val_loop, "setup_data", None)):
            raise RuntimeError(
                f"{__name__} was written for Lightning 2's validation loop, which builds its loaders in "
                "val_loop.setup_data(); this Lightning has none. Leave the speedup validation_loader_ahead out of "
                "train.speedups (config.yaml), or adapt it."
            )
        val_loop.setup_data()  # validation's first step; it builds the loaders only once, so validation keeps them
        loaders = trainer.val_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        if [started for loader in loaders if loader is not None and (started := start_next_epoch(loader, epoch))]:
            self.started_early.append(epoch)
            log.info("Epoch %d: the validation loader's workers start during its last training steps", epoch)

"""Stop a diverging run at the step whose loss is no longer finite, before it is saved.

A NaN or infinite loss trains on in rfdetr and Lightning, and every later checkpoint would carry the damaged weights
forward. `StopOnNonFiniteLoss` looks at every training step's loss and raises `NonFiniteLoss`, naming the epoch and
the step, which ends the training job before the epoch's end writes `last.ckpt`: the last good checkpoint, that of
the epoch before, stays as it was, and the next run resumes from it.

On a GPU the check does not wait for the GPU: each step's verdict travels to pinned host memory without blocking and
is read at the next step, so the run stops one step after the bad one, and at the latest before the epoch's
validation and end, where checkpoints are written. Skipping bad steps is not offered: they mean the recipe diverged,
and training on hides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch

from rfdetr_coco_pipeline.common import StageError


class NonFiniteLoss(StageError):
    """The training loss stopped being finite; the message says where and what to try."""


class StopOnNonFiniteLoss(pl.Callback):
    def __init__(self) -> None:
        self.pending: tuple[Any, int, int] | None = None  # (the host copy of a step's verdict, epoch, step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        finite = torch.isfinite(loss.detach()).all()
        if finite.device.type == "cuda":  # read the verdict of the step before: it has arrived without a wait
            self.raise_if_bad(self.pending)
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(finite, non_blocking=True)
            self.pending = (host, trainer.current_epoch, trainer.global_step)
        else:
            self.raise_if_bad((finite, trainer.current_epoch, trainer.global_step))

    # The epoch's last verdict, before the validation and the epoch's end, where checkpoints are written.
    def on_validation_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.check_the_last_step()

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.check_the_last_step()

    def check_the_last_step(self) -> None:
        if self.pending is not None:
            torch.cuda.current_stream().synchronize()
            self.raise_if_bad(self.pending)
            self.pending = None

    @staticmethod
    def raise_if_bad(verdict: tuple[Any, int, int] | None) -> None:
        if verdict is None or bool(verdict[0]):
            return
        _, epoch, step = verdict
        raise NonFiniteLoss(
            f"The training loss is no longer finite (NaN or infinite) at epoch {epoch + 1}, step {step}: the run "
            "diverged. Training stopped before saving it; the last good checkpoint, that of the epoch before, is "
            "kept. Try a lower train.lr, more train.warmup_epochs, or another GPU profile (fp16 overflows where "
            "bf16 does not); running snakemake again unchanged resumes from the checkpoint and may diverge again."
        )

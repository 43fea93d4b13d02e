"""Two DDP ranks on the CPU (Lightning starts the second), one of which sends itself SIGTERM as a training step
begins: `python -m tests.helpers.sigterm_ranks RANK STEP OUT [lightning]`. Each rank writes OUT/rank-N.json: the
step at which it stopped and whether it stopped with Lightning's SIGTERMException. With `lightning` the run uses
Lightning's own SIGTERM handling instead of the workflow's hook."""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import nullcontext
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Small(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        return self.layer(batch[0]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SignalAndReport(pl.Callback):
    """Sends SIGTERM to this process when rank `rank` begins step `step`; writes how this rank stopped."""

    def __init__(self, rank: int, step: int, out: Path) -> None:
        self.rank, self.step, self.out = rank, step, out

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def report(self, trainer: pl.Trainer, stopped_by: str) -> None:
        record = {"global_step": trainer.global_step, "stopped_by": stopped_by}
        (self.out / f"rank-{trainer.global_rank}.json").write_text(json.dumps(record))

    def on_exception(self, trainer: pl.Trainer, _module: pl.LightningModule, error: BaseException) -> None:
        self.report(trainer, type(error).__name__)

    def on_train_end(self, trainer: pl.Trainer, _module: pl.LightningModule) -> None:
        self.report(trainer, "the end of training")


def main() -> None:
    rank, step, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    from rfdetr_coco_pipeline.hooks.sigterm_at_one_step import sigterm_at_one_step

    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=2)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=[SignalAndReport(rank, step, out)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
    )
    with nullcontext() if sys.argv[4:] == ["lightning"] else sigterm_at_one_step():
        trainer.fit(Small(), data)


if __name__ == "__main__":
    main()

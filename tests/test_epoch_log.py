"""The epoch log's record of what happens between two epochs: the checkpoints Lightning writes after every other
callback's epoch end, which a projection of a longer block has to count once per epoch."""

from __future__ import annotations

import json
import time

from rfdetr_coco_pipeline.training.callbacks.epoch_log import EpochLog


def test_the_seconds_between_epochs_cover_the_previous_epochs_checkpoint(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel

    class TimedCheckpoint(ModelCheckpoint):
        """Lightning's checkpoint callback, as rfdetr sets up last.ckpt, noting when each save starts and ends."""

        saves: list[tuple[float, float]] = []

        def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
            started = time.perf_counter()
            super()._save_checkpoint(trainer, filepath)
            self.saves.append((started, time.perf_counter()))

    checkpoint = TimedCheckpoint(dirpath=tmp_path, filename="last", every_n_epochs=1, save_on_train_epoch_end=True)
    epoch_log = tmp_path / "epochs.jsonl"
    trainer = pl.Trainer(
        max_epochs=3,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[checkpoint, EpochLog(epoch_log)],  # listed first, the checkpoint still runs last
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(BoringModel())
    records = [json.loads(line) for line in epoch_log.read_text().splitlines()]
    assert len(checkpoint.saves) == 3 and (tmp_path / "last.ckpt").is_file()
    assert records[0]["since_previous_epoch_seconds"] is None  # the process's first epoch: the job's start before it
    for record, (started, ended) in zip(records[1:], checkpoint.saves[:-1], strict=True):
        # the previous epoch's save lies in the gap, not in either epoch's training seconds
        assert record["since_previous_epoch_seconds"] >= round(ended - started, 3) > 0

"""Full garbage collections during training skip the objects frozen after each epoch's first steps, and the epoch
log records the full collections that did happen."""

from __future__ import annotations

import gc
import json

import pytest

from rfdetr_coco_pipeline.hooks.callbacks.gc_freeze import FREEZE_AFTER_STEPS, FreezeAfterWarmup, FullCollections
from rfdetr_coco_pipeline.training.callbacks.block_end import StopAtBlockEnd
from rfdetr_coco_pipeline.training.callbacks.epoch_log import EpochLog


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


def test_only_full_collections_are_counted():
    collections = FullCollections()
    collections.start()
    try:
        gc.collect(0)
        gc.collect(1)
        assert collections.count == 0
        gc.collect()
        gc.collect(2)
        assert collections.count == 2 and collections.seconds > 0
    finally:
        collections.stop()
    gc.collect()
    assert collections.count == 2  # stopped: no longer counting


def test_training_freezes_after_the_first_steps_and_the_epoch_log_counts_full_collections(unfrozen, tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Probe(pl.Callback):
        """What the collector holds at each step's start."""

        frozen_at_step: dict[tuple[int, int], int] = {}
        collected_generations: dict[int, bool] = {}

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.frozen_at_step[(trainer.current_epoch, batch_idx)] = gc.get_freeze_count()
            if (trainer.current_epoch, batch_idx) == (1, 0):
                self.made_in_epoch_1 = [batch_idx]
            if (trainer.current_epoch, batch_idx) in ((1, 0), (1, FREEZE_AFTER_STEPS)):
                # an object made in epoch 1 is in a generation the collector visits until that epoch's freeze
                visited = any(o is self.made_in_epoch_1 for g in (0, 1, 2) for o in gc.get_objects(g))
                self.collected_generations[batch_idx] = visited

    class CollectingModel(BoringModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == FREEZE_AFTER_STEPS + 1:
                gc.collect()  # one full collection in the epoch, after the freeze
            return super().training_step(batch, batch_idx)

    epoch_log = tmp_path / "epochs.jsonl"
    probe = Probe()
    trainer = pl.Trainer(
        max_epochs=2,
        limit_train_batches=FREEZE_AFTER_STEPS + 3,
        limit_val_batches=1,
        callbacks=[StopAtBlockEnd(2), EpochLog(epoch_log), FreezeAfterWarmup(), probe],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,  # as rfdetr's trainer
    )
    trainer.fit(CollectingModel())
    frozen = probe.frozen_at_step
    assert frozen[(0, FREEZE_AFTER_STEPS - 1)] == 0  # nothing frozen before the warm-up steps end
    assert frozen[(0, FREEZE_AFTER_STEPS)] > 1000  # then everything the process had built (torch, Lightning, ...)
    assert probe.collected_generations == {0: True, FREEZE_AFTER_STEPS: False}  # frozen again in epoch 1
    records = [json.loads(line) for line in epoch_log.read_text().splitlines()]
    # the full collection the model starts in each epoch is in that epoch's record
    assert [r["full_collections"] >= 1 for r in records] == [True, True]

"""While the model validates, the loader's workers already decode the next epoch's first batches; the batches and
their order stay those of a run without it."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rfdetr_coco_pipeline.hooks.callbacks.next_epoch_during_validation import (
    NextEpochDuringValidation,
    start_next_epoch,
)
from tests.helpers.lightning_trainer import small_trainer

SECONDS_PER_ITEM = 0.25  # a worker takes 1 s for a batch of 4
VALIDATION_SECONDS = 0.8  # per validation batch; two of them: longer than one batch's loading


def note(events: Path, text: str) -> None:
    """Append one event to the shared log (the workers are other processes; a short append is atomic)."""
    with open(events, "a") as handle:
        handle.write(text + "\n")


class SlowItems(torch.utils.data.Dataset):
    def __init__(self, events: Path | None = None) -> None:
        self.events = events

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.events:
            note(self.events, f"load {index}")  # a worker starts on an item
        time.sleep(SECONDS_PER_ITEM)
        return torch.full((4,), float(index)), index


def fit(tmp_path, early: bool):
    """Three epochs of a small model with dropout (it draws from torch's random state at every step), on a shuffled
    loader with persistent workers as rfdetr's; returns the indices of every batch and the order of events: the
    workers starting on items, and each validation's start and end."""
    import pytorch_lightning as pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
            self.batches: list[list[int]] = []

        def on_validation_epoch_start(self) -> None:
            note(events, f"validation starts after epoch {self.current_epoch}")

        def on_validation_epoch_end(self) -> None:
            note(events, f"validation ends after epoch {self.current_epoch}")

        def training_step(self, batch, batch_idx):
            values, indices = batch
            self.batches.append(indices.tolist())
            return self.layer(values).sum()

        def validation_step(self, batch, batch_idx) -> None:
            time.sleep(VALIDATION_SECONDS)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                SlowItems(events), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
            )

        def val_dataloader(self):
            return torch.utils.data.DataLoader(torch.zeros(2, 4), batch_size=1)

    events = tmp_path / "events.txt"
    pl.seed_everything(7, workers=True)
    model = Model()
    early_start = NextEpochDuringValidation() if early else None
    small_trainer(tmp_path, [early_start] if early_start else [], 3).fit(model)
    return model.batches, events.read_text().splitlines(), early_start


def loads_during_validation(events: list[str], epoch: int) -> int:
    """How many items the workers started on while the validation after `epoch` ran."""
    start = events.index(f"validation starts after epoch {epoch}")
    end = events.index(f"validation ends after epoch {epoch}")
    return sum(event.startswith("load") for event in events[start:end])


def test_the_next_epochs_first_batch_is_ready_when_validation_ends_and_the_batches_are_the_same(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "early").mkdir()
    batches, events, _ = fit(tmp_path / "plain", early=False)
    early_batches, early_events, callback = fit(tmp_path / "early", early=True)

    assert len(batches) == 6 and sorted(sum(batches[:2], [])) == list(range(8))
    assert early_batches == batches  # the same images, in the same order, every epoch
    assert callback.started_early == 2  # epochs 1 and 2 (epoch 0 starts before any validation; none follows 2)
    # Without: the workers start on the next epoch only once it starts. With: while the model validates.
    assert [loads_during_validation(events, epoch) for epoch in (0, 1)] == [0, 0]
    assert all(loads_during_validation(early_events, epoch) >= 1 for epoch in (0, 1))


def test_a_loader_without_persistent_workers_is_left_alone():
    loader = torch.utils.data.DataLoader(SlowItems(), batch_size=4, num_workers=0)
    assert start_next_epoch(loader, 1) is False
    assert getattr(loader, "_iterator", None) is None


def test_a_sampler_that_shuffles_by_epoch_gets_the_next_epoch():
    epoch = 3
    dataset = SlowItems()
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=1, persistent_workers=True)
    try:
        assert start_next_epoch(loader, epoch) is True
        assert sampler.epoch == epoch
        primed = iter(loader)  # as Lightning asks at the epoch's start: the same iterator, not reset again
        assert primed is loader._iterator
        first = next(primed)
        assert first[1].tolist() == list(sampler)[:4]
    finally:
        loader._iterator._shutdown_workers()

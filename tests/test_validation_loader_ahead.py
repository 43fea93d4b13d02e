"""During an epoch's last training steps the validation loader's workers already decode the validation's batches;
the validation sees the same batches in the same order as without it."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rfdetr_coco_pipeline.hooks.callbacks.validation_loader_ahead import ValidationLoaderAhead, batches_in_flight
from tests.helpers.lightning_trainer import small_trainer

WAIT_FOR_WORKERS_SECONDS = 120  # only a bound for a hung worker: the test waits for an event, not for a time


def note(events: Path, text: str) -> None:
    """Append one event to the shared log (the workers are other processes; a short append is atomic)."""
    with open(events, "a") as handle:
        handle.write(text + "\n")


class Items(torch.utils.data.Dataset):
    def __init__(self, events: Path, split: str, count: int) -> None:
        self.events, self.split, self.count = events, split, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        note(self.events, f"{self.split} load {index}")
        return torch.full((4,), float(index)), index


def validation_loads(events: Path) -> list[str]:
    return [line for line in events.read_text().splitlines() if line.startswith("val load")] if events.exists() else []


def fit(tmp_path: Path, ahead: bool, epochs: int = 2):
    """Two epochs of a small model on loaders with persistent workers, as rfdetr's (training: 4 batches of 4 from 2
    workers; validation: 3 batches of 2 from 2 workers). At each epoch's last training step the model notes how many
    validation items the workers had started on; with the callback it waits for the first (WAIT_FOR_WORKERS_SECONDS
    only bounds a hang). Returns those counts, the validation batches and the callback."""
    import pytorch_lightning as pl

    events = tmp_path / "events.txt"

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.loads_before_validation: list[int] = []
            self.validation_batches: list[list[int]] = []

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:  # runs after the callbacks' batch end
            if batch_idx + 1 < self.trainer.num_training_batches:
                return
            deadline = time.monotonic() + WAIT_FOR_WORKERS_SECONDS
            while ahead and not validation_loads(events) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.loads_before_validation.append(len(validation_loads(events)))

        def on_validation_epoch_end(self) -> None:
            events.unlink(missing_ok=True)  # each epoch's count starts afresh

        def validation_step(self, batch, batch_idx) -> None:
            self.validation_batches.append(batch[1].tolist())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                Items(events, "train", 16), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
            )

        def val_dataloader(self):
            return torch.utils.data.DataLoader(
                Items(events, "val", 6), batch_size=2, num_workers=2, persistent_workers=True
            )

    pl.seed_everything(7, workers=True)
    model = Model()
    callback = ValidationLoaderAhead() if ahead else None
    small_trainer(tmp_path, [callback] if callback else [], epochs).fit(model)
    return model, callback


def test_the_validation_batches_are_on_their_way_before_validation_starts_and_are_the_same(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "ahead").mkdir()
    plain, _ = fit(tmp_path / "plain", ahead=False)
    ahead, callback = fit(tmp_path / "ahead", ahead=True)

    # Without it nothing asks for the validation loader before validation; with it, every epoch's end did.
    assert plain.loads_before_validation == [0, 0]
    assert all(count >= 1 for count in ahead.loads_before_validation)
    assert callback.started_early == [0, 1]
    # The same validation batches, in the same order, every epoch.
    assert ahead.validation_batches == plain.validation_batches == [[0, 1], [2, 3], [4, 5]] * 2


def test_epochs_whose_end_does_not_validate_are_left_alone(tmp_path):
    import pytorch_lightning as pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx) -> None:
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Items(tmp_path / "t.txt", "train", 8), batch_size=4)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(
                Items(tmp_path / "v.txt", "val", 4), batch_size=2, num_workers=1, persistent_workers=True
            )

    callback = ValidationLoaderAhead()
    small_trainer(tmp_path, [callback], 3, check_val_every_n_epoch=2).fit(Model())
    assert callback.started_early == [1]  # epochs 0 and 2 end without validation


def test_the_lead_is_what_the_training_loaders_workers_hold():
    dataset = torch.zeros(8, 4)
    assert batches_in_flight(torch.utils.data.DataLoader(dataset, num_workers=0)) == 0
    assert batches_in_flight(torch.utils.data.DataLoader(dataset, num_workers=3)) == 6
    assert batches_in_flight(torch.utils.data.DataLoader(dataset, num_workers=3, prefetch_factor=4)) == 12

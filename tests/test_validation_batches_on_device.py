"""After the first validation its batches stay on the training device: later validations get the same batches, in
the same order, without the loader's workers decoding anything; a pass that does not fit, or is cut short, keeps
nothing and every validation reads the loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rfdetr_extensions import CHECKED_RFDETR, applied, select_speedups
from rfdetr_extensions.callbacks.validation_batches_on_device import KeptBatches, ValidationBatchesOnDevice
from rfdetr_extensions.callbacks.validation_loader_ahead import ValidationLoaderAhead
from tests.helpers.lightning_trainer import small_trainer
from tests.helpers.rfdetr_steps import assert_same_batch, rfdetr_datamodule


class Items(torch.utils.data.Dataset):
    """Item i is (a vector of i, i); each load is noted in a file (the workers are other processes)."""

    def __init__(self, events: Path, count: int) -> None:
        self.events, self.count = events, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with open(self.events, "a") as handle:
            handle.write(f"{index}\n")
        return torch.full((4,), float(index)), index


def fit(root: Path, callbacks: list, epochs: int = 3, **settings):
    """A small model for `epochs` epochs; validation: 3 batches of 2 from 2 persistent workers, as rfdetr's loader.
    Returns the model, which holds each validation's batches and how many items the workers loaded for it."""
    import pytorch_lightning as pl

    events = root / "loads.txt"

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.batches: list[list[list[int]]] = []
            self.loads: list[int] = []

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def on_validation_epoch_start(self) -> None:
            self.batches.append([])

        def validation_step(self, batch, batch_idx) -> None:
            self.batches[-1].append([batch[0][:, 0].tolist(), batch[1].tolist()])

        def on_validation_epoch_end(self) -> None:
            self.loads.append(len(events.read_text().splitlines()) if events.exists() else 0)
            events.unlink(missing_ok=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(8, 4)), batch_size=4)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(Items(events, 6), batch_size=2, num_workers=2, persistent_workers=True)

    root.mkdir(parents=True, exist_ok=True)
    model = Model()
    small_trainer(root, callbacks, epochs, **settings).fit(model)
    return model


EVERY_EPOCH = [[[[0.0, 1.0], [0, 1]], [[2.0, 3.0], [2, 3]], [[4.0, 5.0], [4, 5]]]] * 3


def test_later_validations_replay_the_first_ones_batches_without_the_loaders_workers(tmp_path):
    plain = fit(tmp_path / "plain", [])
    callback = ValidationBatchesOnDevice()
    kept = fit(tmp_path / "kept", [callback])

    assert plain.batches == kept.batches == EVERY_EPOCH  # the same batches, in the same order, every validation
    assert plain.loads == [6, 6, 6]
    assert kept.loads == [6, 0, 0]  # the workers decoded the set once
    (keeper,) = callback.keepers
    assert keeper.complete and keeper.replays == 2
    assert keeper.workers is None  # shut down once the pass was kept


def test_with_the_validation_loader_ahead_only_the_first_validation_starts_workers_early(tmp_path):
    ahead = ValidationLoaderAhead()
    model = fit(tmp_path, [ValidationBatchesOnDevice(), ahead])
    assert model.batches == EVERY_EPOCH
    assert model.loads == [6, 0, 0]
    assert ahead.started_early == [0]  # later validations have no workers to start


def test_a_pass_that_would_not_fit_keeps_nothing_and_every_validation_reads_the_loader(tmp_path, caplog):
    class NoRoom(ValidationBatchesOnDevice):
        share_of_free_memory = 0.0

    callback = NoRoom()
    with caplog.at_level("WARNING"):
        model = fit(tmp_path, [callback])
    assert model.batches == EVERY_EPOCH
    assert model.loads == [6, 6, 6]
    (keeper,) = callback.keepers
    assert not keeper.complete and not keeper.kept
    assert "Validation batches not kept: the validation batches would take" in caplog.text


def test_a_validation_cut_short_keeps_nothing(tmp_path):
    callback = ValidationBatchesOnDevice()
    model = fit(tmp_path, [callback], limit_val_batches=2)
    assert model.batches == [EVERY_EPOCH[0][:2]] * 3
    assert all(loads >= 4 for loads in model.loads)  # each validation read its two batches from the workers
    assert not callback.keepers[0].complete


def test_a_loader_without_persistent_workers_is_left_alone_and_the_log_says_so_once(tmp_path, caplog):
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
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(8, 4)), batch_size=4)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(4, 4)), batch_size=2)

    callback = ValidationBatchesOnDevice()
    with caplog.at_level("INFO"):
        small_trainer(tmp_path, [callback], 2).fit(Model())
    assert callback.keepers == []
    assert caplog.text.count("Validation batches not kept: the validation loader's workers do not persist") == 1


def rfdetr_validation_batches(tmp_path: Path, dataset: Path, speedups: list[str], accelerator: str) -> tuple:
    """Three epochs of a stand-in model on rfdetr's own data module (2 persistent workers, batches of 2, the
    validation images as uint8 until the device): each validation's batches as the validation step gets them."""
    import pytorch_lightning as pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))
            self.batches: list[list] = []

        def training_step(self, batch, batch_idx):
            return self.weight.sum()

        def on_validation_epoch_start(self) -> None:
            self.batches.append([])

        def validation_step(self, batch, batch_idx) -> None:
            images, targets = batch
            self.batches[-1].append(batch)
            # A write to what the step gets must not reach the batches kept for the next validation.
            images.tensors.add_(1.0)
            for target in targets:
                target["boxes"].mul_(0.5)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    with applied(select_speedups(speedups, CHECKED_RFDETR)) as callbacks:
        model = Model()
        small_trainer(tmp_path, list(callbacks), 3, accelerator=accelerator).fit(
            model, datamodule=rfdetr_datamodule(dataset, batch_size=2, num_workers=2)
        )
    return model, callbacks


def assert_rfdetrs_batches_replayed(tmp_path: Path, dataset: Path, accelerator: str) -> KeptBatches:
    as_bytes = ["validation_images_as_bytes", "targets_one_copy"]
    (tmp_path / "plain").mkdir()
    (tmp_path / "kept").mkdir()
    plain, _ = rfdetr_validation_batches(tmp_path / "plain", dataset, as_bytes, accelerator)
    kept, (callback,) = rfdetr_validation_batches(
        tmp_path / "kept", dataset, [*as_bytes, "validation_batches_on_device"], accelerator
    )
    assert len(plain.batches) == len(kept.batches) == 3
    for plain_batches, kept_batches in zip(plain.batches, kept.batches, strict=True):
        assert len(plain_batches) == len(kept_batches) == 2  # the tiny set's 4 validation images
        for ours, rfdetr_s in zip(kept_batches, plain_batches, strict=True):
            assert_same_batch(ours, rfdetr_s)
    (keeper,) = callback.keepers
    assert keeper.complete and keeper.replays == 2
    return keeper


@pytest.mark.slow
def test_rfdetrs_validation_batches_replayed_equal_its_loaders(tmp_path, tiny_dataset):
    assert_rfdetrs_batches_replayed(tmp_path, tiny_dataset, "cpu")


@pytest.mark.gpu
def test_on_the_gpu_rfdetrs_validation_batches_are_kept_there_as_bytes_and_replayed_equal(tmp_path, tiny_dataset):
    keeper = assert_rfdetrs_batches_replayed(tmp_path, tiny_dataset, "gpu")
    images, targets = keeper.kept[0]
    assert images.tensors.device.type == "cuda" and images.tensors.dtype == torch.uint8
    assert all(field.device.type == "cuda" for field in targets.fields.values())

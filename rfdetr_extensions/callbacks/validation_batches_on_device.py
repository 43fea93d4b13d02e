"""After a job's first validation its batches stay on the training device; later validations read them there.

rfdetr's validation set is read in order (a sequential sampler) through a pipeline without randomness (resize, to
tensor, normalise), so every validation of a training job gets the same batches in the same order. Yet the
loader's workers decode every image again each time: COCO's 5,000 validation JPEGs take the H200 machine's 16
cores 4.3-4.5 s (`python -m bench.loader --split val --images-as-bytes`), most of a validation, while the next
epoch's loader workers (`next_epoch_during_validation`), the F1 matching workers and the COCO evaluation want the
same cores.

`ValidationBatchesOnDevice` stands in for the validation loader's persistent iterator (`DataLoader._iterator`: the
object torch's `DataLoader.__iter__` resets and returns when workers persist). During a validation it hands on the
workers' batches moved to the training device, as Lightning would move them, and keeps them. Once the workers'
iterator ends the set is complete and the workers are shut down; every later validation replays the kept batches,
and Lightning's transfer (rfdetr's `transfer_batch_to_device`) finds them on the device already. With
`validation_images_as_bytes` the images are kept as uint8: COCO's 5,000 images at 384 px take 2.2 GB.

It replaces where later validations get their batches, nothing of rfdetr's. Guarantees: the batches, their order
and their values are the loader's (a validation cut short keeps nothing and the next one reads the loader again);
nothing is kept when the batches would take more than `SHARE_OF_FREE_MEMORY` of the device memory free at the
first batch (every validation then reads the loader, as without it, and the log says so), nor for a loader without
persistent workers. Assumes the validation pipeline is deterministic, as rfdetr's is. Shown by
`tests/test_validation_batches_on_device.py` (on the GPU too: `pytest -m gpu`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

log = logging.getLogger(__name__)

# The kept batches stay allocated through training; half of what is free when validation starts leaves the other
# half for validation's own activations and the allocator's slack.
SHARE_OF_FREE_MEMORY = 0.5


def free_memory(device: Any) -> int:
    """Bytes free on `device`: the GPU's free memory, or the host's available memory for the CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def batch_bytes(batch: Any) -> int:
    """The bytes of every tensor in a batch (tuples, lists, dicts, NestedTensor, PackedTargets)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, dict):
        return sum(batch_bytes(value) for value in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(value) for value in batch)
    fields = getattr(batch, "fields", None)  # rfdetr's PackedTargets
    if fields is not None:
        return sum(batch_bytes(value) for value in fields.values())
    tensors = getattr(batch, "tensors", None)  # rfdetr's NestedTensor
    if isinstance(tensors, torch.Tensor):
        mask = getattr(batch, "mask", None)
        return batch_bytes(tensors) + (batch_bytes(mask) if mask is not None else 0)
    return 0


def to_device(batch: Any, device: Any) -> Any:
    """`batch` with everything that has a `.to` (tensors, NestedTensor, PackedTargets) copied to `device` without
    waiting, inside tuples, lists and dicts. rfdetr's targets stay packed, so that rfdetr's transfer gives every
    validation its own copies of them (Lightning's `move_data_to_device` would copy these objects blocking)."""
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(value, device) for value in batch)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if callable(getattr(batch, "to", None)):
        return batch.to(device, non_blocking=True)
    return batch


class KeptBatches:
    """A validation loader's persistent iterator that keeps the workers' batches on `device` and replays them.

    Torch's `DataLoader.__iter__` calls `_reset(loader)` and returns this object, as it does with its own
    persistent iterator."""

    def __init__(self, loader: Any, device: Any, share_of_free_memory: float) -> None:
        self.loader = loader
        self.device = device
        self.share_of_free_memory = share_of_free_memory
        self.workers = loader._iterator  # torch's iterator, or None before the loader's first iteration
        self.kept: list[Any] = []
        self.complete = False  # every batch of a whole pass is kept
        self.refused: str | None = None  # why nothing is kept, once decided
        self.position = 0
        self.replays = 0  # validations served from the kept batches

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self.position = 0
        if self.complete:
            return
        self.kept = []  # a pass cut short is not replayed: it starts again
        if self.workers is None:
            self.workers = loader._get_iterator()  # starts the workers on the first batches
        else:
            self.workers._reset(loader)

    def __iter__(self) -> KeptBatches:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self) -> Any:
        if self.complete:
            if self.position == len(self.kept):
                raise StopIteration
            self.replays += self.position == 0
            self.position += 1
            return self.kept[self.position - 1]
        batch = next(self.workers)
        if self.refused is not None:
            return batch
        if not self.kept and not self.fits(batch):
            return batch
        moved = to_device(batch, self.device)
        self.kept.append(moved)
        self.position = len(self.kept)
        # Lightning stops at the loader's length without asking for the end, so the last batch settles the pass.
        if len(self.kept) == len(self.loader):
            self.settle()
        return moved

    def fits(self, first: Any) -> bool:
        """Whether a whole pass of batches like `first` fits in the memory share; if not, says so once."""
        needed = batch_bytes(first) * len(self.loader)
        free = free_memory(self.device)
        if needed <= free * self.share_of_free_memory:
            return True
        self.refused = (
            f"the validation batches would take {needed / 1e9:.1f} GB on {self.device}, more than "
            f"{self.share_of_free_memory:.0%} of the {free / 1e9:.1f} GB free"
        )
        log.warning("Validation batches not kept: %s; every validation reads the loader", self.refused)
        return False

    def settle(self) -> None:
        """The whole pass is kept: later validations replay it, and the workers are no longer needed."""
        self.complete = True
        self.workers._shutdown_workers()
        self.workers = None
        log.info(
            "Validation batches kept on %s (%d batches, %.2f GB): later validations read them there",
            self.device,
            len(self.kept),
            sum(batch_bytes(batch) for batch in self.kept) / 1e9,
        )


class ValidationBatchesOnDevice(pl.Callback):
    """The validation loader's batches stay on the training device after the first validation (module's text)."""

    share_of_free_memory = SHARE_OF_FREE_MEMORY

    def __init__(self) -> None:
        self.keepers: list[KeptBatches] = []
        self.left_alone: set[int] = set()  # ids of the loaders without persistent workers, said once

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        # Before the epoch's validation asks for its iterator, which Lightning's validation loop does before any
        # validation hook runs.
        if trainer.state.fn != TrainerFn.FITTING or trainer.limit_val_batches == 0:
            return
        val_loop = getattr(trainer.fit_loop.epoch_loop, "val_loop", None)
        if not callable(getattr(val_loop, "setup_data", None)):
            raise RuntimeError(
                f"{__name__} was written for Lightning 2's validation loop, which builds its loaders in "
                "val_loop.setup_data(); this Lightning has none. Leave the speedup validation_batches_on_device out "
                "of train.speedups (config.yaml), or adapt it."
            )
        val_loop.setup_data()  # builds the loaders once; validation keeps them
        loaders = trainer.val_dataloaders
        for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
            if loader is None or isinstance(getattr(loader, "_iterator", None), KeptBatches):
                continue
            if not (getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0):
                if id(loader) not in self.left_alone:
                    self.left_alone.add(id(loader))
                    log.info("Validation batches not kept: the validation loader's workers do not persist")
                continue
            if not hasattr(loader, "_get_iterator"):
                raise RuntimeError(
                    f"{__name__} was written for torch's DataLoader, which keeps one iterator per loader with "
                    "persistent workers; this torch does otherwise. Leave the speedup validation_batches_on_device "
                    "out of train.speedups (config.yaml), or adapt it."
                )
            keeper = KeptBatches(loader, module.device, self.share_of_free_memory)
            loader._iterator = keeper
            self.keepers.append(keeper)

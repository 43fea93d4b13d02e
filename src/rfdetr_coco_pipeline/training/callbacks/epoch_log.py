"""Per-epoch timings, step losses and learning rates of a training run, appended to a JSON-lines file.

`EpochLog` writes one record per epoch (rank 0 only) to the file it is given: train and validation seconds, images
and images/s, the seconds between the previous epoch's record and this epoch's start (that epoch's checkpoints,
which Lightning's checkpoint callbacks write after every other callback's epoch end), the host's wait for data and
for the first batch, where the validation's time went (its loader's first
batch, its batches, its end: the COCO metric and the F1 sweep), torch.compile's cache lookups (a cold cache shows
misses: graphs compiled in this epoch), a digest of torch's random number generators at the epoch's start (two runs
of one seed whose digests part drew different random numbers before that epoch, its loader's worker seeds among
them), peak GPU memory, full garbage collections and the objects frozen (`gc_freeze`), and, per step, the learning
rate, the training loss and (on a GPU) the step's duration on the GPU's own clock. Losses stay on the device until
the epoch ends and step ends are CUDA events read then, so recording them adds no wait for the GPU. The workflow's
train stage and `bench.stock_recipe` both use it, so their records compare one to one.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from rfdetr_coco_pipeline.hooks.callbacks.gc_freeze import FullCollections

log = logging.getLogger(__name__)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def compile_cache_counts() -> dict[str, int]:
    """torch.compile's cache lookups in this process so far: Inductor's compiled graphs (its FX graph cache) and
    AOTAutograd's forward and backward pairs, each found (hits) or compiled (misses)."""
    from torch._dynamo.utils import counters

    return {
        "graph_hits": counters["inductor"]["fxgraph_cache_hit"],
        "graph_misses": counters["inductor"]["fxgraph_cache_miss"],
        "autograd_hits": counters["aot_autograd"]["autograd_cache_hit"],
        "autograd_misses": counters["aot_autograd"]["autograd_cache_miss"],
    }


def rng_digests() -> dict[str, str]:
    """Short digests of torch's CPU generator and, on a GPU, the current device's: equal states, equal digests.
    Reading the states queues nothing on the GPU."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return {name: hashlib.sha1(state.numpy().tobytes()).hexdigest()[:12] for name, state in states.items()}


class EpochLog(pl.Callback):
    """Appends one JSON record per epoch to `path` (see the module's text)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.full_collections = FullCollections()  # the process's full garbage collections
        self.previous_epoch_ended: float | None = None  # this callback's end of the process's previous epoch

    def setup(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
        self.full_collections.start()

    def teardown(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
        self.full_collections.stop()

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        sync()
        self.record: dict[str, Any] = {"epoch": trainer.current_epoch, "images": 0, "lr": []}
        # None in a process's first epoch: what ran before it is the job's start
        self.record["since_previous_epoch_seconds"] = (
            None if self.previous_epoch_ended is None else round(time.perf_counter() - self.previous_epoch_ended, 3)
        )
        self.record["rng_digests"] = rng_digests()
        self.losses: list[Any] = []
        # An event on the GPU's stream at each step's end: the steps' durations on the GPU's own clock, read
        # once the epoch ends, so timing a step costs no wait.
        self.step_ends: list[Any] = []
        self.first_step_started: float | None = None
        self.collections_before = (self.full_collections.count, self.full_collections.seconds)
        self.data_wait = 0.0  # host seconds between one step's end and the next one's start: the loader
        self.step_ended: float | None = None
        self.started = time.perf_counter()
        self.val_seconds = 0.0
        self.validation = {"first_batch_seconds": 0.0, "batches_seconds": 0.0, "end_seconds": 0.0}
        self.cache_before = compile_cache_counts()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, idx: int) -> None:
        self.record["lr"].append(trainer.optimizers[0].param_groups[0]["lr"])
        if self.first_step_started is None:
            self.first_step_started = time.perf_counter()
        if self.step_ended is not None:
            self.data_wait += time.perf_counter() - self.step_ended

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        images = batch[0]  # this rank's share: under DDP every rank takes an equal batch
        self.record["images"] += int(getattr(images, "tensors", images).shape[0]) * trainer.world_size
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self.losses.append(loss.detach().float().reshape(()))
        if torch.cuda.is_available():
            self.step_ends.append(torch.cuda.Event(enable_timing=True))
            self.step_ends[-1].record()
        self.step_ended = time.perf_counter()

    def on_validation_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        sync()
        self.val_started = time.perf_counter()
        self.val_first_batch: float | None = None
        self.val_last_batch_end: float | None = None

    def on_validation_batch_start(
        self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.val_first_batch is None:
            self.val_first_batch = time.perf_counter()

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.val_last_batch_end = time.perf_counter()  # host time: the GPU may still run this batch

    # Called after rfdetr's COCO evaluation callback, which computes the metrics in its own epoch-end hook.
    def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        sync()
        ended = time.perf_counter()
        self.val_seconds += ended - self.val_started
        first = self.val_first_batch or ended
        last = self.val_last_batch_end or first
        self.validation["first_batch_seconds"] += first - self.val_started
        self.validation["batches_seconds"] += last - first
        self.validation["end_seconds"] += ended - last

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        sync()
        total = time.perf_counter() - self.started
        train_seconds = total - self.val_seconds  # validation runs inside the epoch, before this hook
        self.record["loss"] = torch.stack(self.losses).cpu().tolist() if self.losses else []
        self.record["step_seconds"] = [  # from the end of one step to the end of the next, on the GPU
            round(start.elapsed_time(end) / 1000, 5) for start, end in itertools.pairwise(self.step_ends)
        ]
        self.record.update(
            train_seconds=round(train_seconds, 3),
            val_seconds=round(self.val_seconds, 3),
            # validation start to its first batch (its loader's start), its first batch to the host's last batch
            # end, and from there to its end (the GPU's last batches, the COCO metric, the F1 sweep)
            validation={name: round(seconds, 3) for name, seconds in self.validation.items()},
            images_per_second=round(self.record["images"] / max(train_seconds, 1e-9), 2),
            data_wait_seconds=round(self.data_wait, 3),
            # epoch start to the first step: the loader's first batch (and any epoch-start work)
            first_batch_seconds=round((self.first_step_started or time.perf_counter()) - self.started, 3),
            # full garbage collections during the epoch (validation included): each stops the training thread
            full_collections=self.full_collections.count - self.collections_before[0],
            full_collection_seconds=round(self.full_collections.seconds - self.collections_before[1], 3),
            frozen_objects=gc.get_freeze_count(),  # objects full collections skip (gc_freeze)
            compile_cache={name: count - self.cache_before[name] for name, count in compile_cache_counts().items()},
            peak_memory_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else 0,
        )
        if trainer.is_global_zero:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(self.record) + "\n")
        log.info(
            "epoch %d: %.1f s train (%.1f images/s), %.1f s validation",
            self.record["epoch"],
            train_seconds,
            self.record["images_per_second"],
            self.val_seconds,
        )
        self.previous_epoch_ended = time.perf_counter()

"""Train one block of epochs of RF-DETR Nano with the reference notebook's recipe.

Every block calls rfdetr's `train()` with the full epoch count, so the cosine schedule is the one of
an uninterrupted run, and stops itself at the end of its block (rfdetr 1.11.2 sizes the schedule from
the `epochs` it is given: a block that passed its own epoch count would restart the decay).

rfdetr's output folder (the "state folder", results/train/state/<recipe id>/) is not a declared
Snakemake output, so a failed or killed job cannot delete it: `last.ckpt` there is rewritten every
epoch and the retried job resumes from it, losing at most the epoch in flight. The recipe id is a
hash of every setting that shapes the training, so a checkpoint made under another recipe is never
resumed. At the end of a block its checkpoint, best weights, metrics and timings are copied into the
block's output folder, which the next block (and the plot) reads.
"""

from __future__ import annotations

import argparse
import csv
import gc
import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from scripts.common import (
    StageError,
    log,
    patch_rfdetr,
    pipeline_config,
    read_json,
    rfdetr_version,
    run_main,
    where_this_runs,
    write_json,
)
from scripts.deformable_sampling import deformable_sampling
from scripts.ema_without_waiting import ema_without_waiting
from scripts.gather_matched_targets import gather_matched_targets
from scripts.gc_freeze import FullCollections, freeze_after_warmup_callback
from scripts.gpu_profiles import Device, detect_device, resolve_profile, settle_profile
from scripts.images_as_bytes import images_as_bytes
from scripts.lr_log_on_device import lr_log_on_device
from scripts.matches_on_device import matches_on_device
from scripts.matching_without_waiting import matching_without_waiting
from scripts.next_epoch_during_validation import next_epoch_during_validation_callback
from scripts.nice_loader_workers import nice_loader_workers
from scripts.padding_in_one_copy import padding_in_one_copy
from scripts.stage import remove_staged
from scripts.static_cuda_graphs import static_cuda_graphs_callback
from scripts.targets_one_copy import targets_one_copy
from scripts.verify_counts import count_images

INIT_NOTE = (
    "Initialisation: pretrain_weights=None, so no released detector checkpoint is loaded. For Nano (patch 16, "
    "24x24 position grid) rfdetr 1.11.2 also loads NO DINOv2 backbone weights: the whole model, backbone "
    "included, starts from random initialisation, although the reference notebook says the backbone keeps "
    "its DINOv2 weights. Expect lower mAP than a DINOv2-initialised run."
)
RECIPE_KEYS = (
    "epochs",
    "seed",
    "warmup_epochs",
    "resolution",
    "grad_accum_steps",
    "multi_scale",
    "square_resize_div_64",
    "eval_interval",
    "gpus",
)


# ---------------------------------------------------------------- recipe ----


def recipe_of(train: Mapping[str, Any], profile: Mapping[str, Any], rfdetr: str) -> dict[str, Any]:
    """Every setting that shapes the trained weights; checkpoints resume only under an equal recipe."""
    lr_scale = train["gpus"] if train.get("lr_scaling", "linear") == "linear" else 1
    return {
        "model": "RFDETRNano",
        "pretrain_weights": None,
        "rfdetr": rfdetr,
        **{key: train[key] for key in RECIPE_KEYS},
        "lr": train["lr"] * lr_scale,
        "lr_encoder": train["lr_encoder"] * lr_scale,
        "batch_size": profile["batch_size"],
        "precision": profile["precision"],
    }


def recipe_id(recipe: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def recipe_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))


# ---------------------------------------------------------------- resume ----


@dataclass(frozen=True)
class ResumePlan:
    checkpoint: Path | None  # None: start from scratch
    next_epoch: int  # first epoch to train (== end: the block is already trained)
    note: str


def checkpoint_epoch(path: Path) -> int:
    """The last completed epoch (0-based) stored in a Lightning checkpoint."""
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["epoch"])


def plan_resume(state_last: Path, state_epoch: int | None, previous: Path | None, start: int, end: int) -> ResumePlan:
    """Where block [start, end) continues from.

    `state_last`/`state_epoch`: the state folder's in-progress checkpoint and its completed epoch (None when
    there is none); `previous`: the previous block's checkpoint (None for the first block).
    """
    if state_epoch is not None and start < state_epoch + 1 <= end:
        done = state_epoch + 1
        if done == end:
            return ResumePlan(state_last, end, f"epochs up to {end} are already trained in {state_last}")
        return ResumePlan(state_last, done, f"resuming the interrupted block from {state_last} at epoch {done + 1}")
    if start == 0:
        return ResumePlan(None, 0, "starting from scratch")
    if previous is None:
        raise StageError(f"Block starting at epoch {start} has no previous checkpoint to resume from.")
    return ResumePlan(previous, start, f"resuming from the previous block's checkpoint {previous}")


def truncate_metrics(metrics: Path, next_epoch: int) -> None:
    """Drop metrics.csv rows of epochs that will be trained again (rfdetr appends to the file on resume)."""
    if not metrics.is_file():
        return
    with open(metrics, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames or [], [r for r in reader if int(r["epoch"]) < next_epoch]
    with open(metrics, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def block_metrics(metrics: Path, start: int, end: int, output: Path) -> int:
    with open(metrics, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames or [], [r for r in reader if start <= int(r["epoch"]) < end]
    with open(output, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def read_epoch_log(path: Path, start: int, end: int) -> list[dict[str, Any]]:
    """The newest timing record of every epoch in [start, end) from the state folder's epochs.jsonl."""
    latest: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if start <= record["epoch"] < end:
                    latest[record["epoch"]] = record
    return [latest[e] for e in sorted(latest)]


# ------------------------------------------------------- rfdetr extension ----


def lightning_callbacks(stop_at: int, epoch_log: Path) -> list[Any]:
    """A callback that ends training after epoch `stop_at - 1`, and one that records timings and LRs."""
    import pytorch_lightning as pl
    import torch

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StopAtBlockEnd(pl.Callback):
        def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            if trainer.current_epoch + 1 >= stop_at:
                trainer.should_stop = True

    class EpochLog(pl.Callback):
        """Per epoch: train seconds, images, images/s, validation seconds, peak memory, and the LR and loss per
        step. Losses stay on the device until the epoch ends, so recording them adds no host sync per step."""

        def __init__(self) -> None:
            self.full_collections = FullCollections()  # the process's full garbage collections (gc_freeze.py)

        def setup(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
            self.full_collections.start()

        def teardown(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
            self.full_collections.stop()

        def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            sync()
            self.record: dict[str, Any] = {"epoch": trainer.current_epoch, "images": 0, "lr": []}
            self.losses: list[Any] = []
            # An event on the GPU's stream at each step's end: the steps' durations on the GPU's own clock, read
            # once the epoch ends, so timing a step costs no wait (the mid-epoch rate, without epoch boundaries).
            self.step_ends: list[Any] = []
            self.first_step_started: float | None = None
            self.collections_before = (self.full_collections.count, self.full_collections.seconds)
            self.data_wait = 0.0  # host seconds between one step's end and the next one's start: the loader
            self.step_ended: float | None = None
            self.started = time.perf_counter()
            self.val_seconds = 0.0
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

        def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            sync()
            self.val_seconds += time.perf_counter() - self.val_started

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
                images_per_second=round(self.record["images"] / max(train_seconds, 1e-9), 2),
                data_wait_seconds=round(self.data_wait, 3),
                # epoch start to the first step: the loader's first batch (and any epoch-start work)
                first_batch_seconds=round((self.first_step_started or time.perf_counter()) - self.started, 3),
                # full garbage collections during the epoch (validation included): each stops the training thread
                full_collections=self.full_collections.count - self.collections_before[0],
                full_collection_seconds=round(self.full_collections.seconds - self.collections_before[1], 3),
                frozen_objects=gc.get_freeze_count(),  # objects full collections skip (scripts/gc_freeze.py)
                peak_memory_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else 0,
            )
            if trainer.is_global_zero:
                with open(epoch_log, "a") as handle:
                    handle.write(json.dumps(self.record) + "\n")
            log.info(
                "epoch %d: %.1f s train (%.1f images/s), %.1f s validation",
                self.record["epoch"],
                train_seconds,
                self.record["images_per_second"],
                self.val_seconds,
            )

    return [StopAtBlockEnd(), EpochLog()]


def single_node_ddp_plugins(gpus: int) -> list[Any]:
    """Inside a SLURM job, Lightning expects `srun` to have started one task per GPU; this workflow starts one
    process per job, so for several GPUs on one node Lightning must start the other ranks itself."""
    if gpus <= 1:
        return []
    from lightning_fabric.plugins.environments import LightningEnvironment

    return [LightningEnvironment()]


def extra_callbacks(callbacks: list[Any], plugins: list[Any] | None = None) -> AbstractContextManager[None]:
    """Add Lightning callbacks (and plugins) to the Trainer that rfdetr's `train()` builds.

    rfdetr 1.11.2 takes no callbacks argument; its `train()` imports `rfdetr.training.build_trainer` at call
    time, so wrapping that public function is enough. Checked against the exact version it was written for.
    """

    def with_callbacks(original: Callable[..., Any]) -> Callable[..., Any]:
        def build_trainer(*args: Any, **kwargs: Any) -> Any:
            trainer = original(*args, **kwargs, **({"plugins": plugins} if plugins else {}))
            trainer.callbacks.extend(callbacks)
            return trainer

        return build_trainer

    return patch_rfdetr(
        "rfdetr.training", "build_trainer", with_callbacks, "The workflow's trainer hook (scripts/train.py)"
    )


def configure_compile_cache(cache_dir: Path) -> None:
    """Keep torch.compile's caches with the run so a resumed job or the next block reuses them."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def eval_batch_size(val_images: int, batch_size: int, ranks: int = 1) -> int:
    """The largest validation batch, up to the training batch, that divides each rank's share of the validation
    set: every validation batch then has one shape, and the compiled model does not recompile for a smaller last
    batch (COCO's 5,000 images at batch 128 would leave a last batch of 8). When no divisor comes within a
    quarter of the training batch, one extra compile beats many small batches: keep the training batch."""
    share = -(-val_images // ranks)
    best = max(d for d in range(1, min(batch_size, share) + 1) if share % d == 0)
    return best if best >= max(1, batch_size // 4) else batch_size


def train_kwargs(recipe: Mapping[str, Any], dataset: str, state_dir: Path, workers: int, device: Device) -> dict:
    """Keyword arguments for rfdetr's `train()`: the reference notebook's call, plus resume and device."""
    amp = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp32": None}[recipe["precision"]]
    kwargs: dict[str, Any] = dict(
        dataset_file="coco",
        dataset_dir=dataset,
        output_dir=str(state_dir),
        epochs=recipe["epochs"],
        batch_size=recipe["batch_size"],
        num_workers=workers,
        seed=recipe["seed"],
        lr=recipe["lr"],
        lr_encoder=recipe["lr_encoder"],
        lr_scheduler="cosine",
        warmup_epochs=recipe["warmup_epochs"],
        resolution=recipe["resolution"],
        tensorboard=False,
        progress_bar="tqdm",
        amp_dtype=amp,
        grad_accum_steps=recipe["grad_accum_steps"],
        multi_scale=recipe["multi_scale"],
        square_resize_div_64=recipe["square_resize_div_64"],
        eval_interval=recipe["eval_interval"],
        eval_batch_size=eval_batch_size(count_images(Path(dataset) / "val2017"), recipe["batch_size"], recipe["gpus"]),
        # last.ckpt is written every epoch only while checkpoint_interval > 1; the interval archives are not
        # needed (each block keeps its own checkpoint), so write at most one.
        checkpoint_interval=max(2, recipe["epochs"]),
    )
    if device.kind == "cpu":
        kwargs["device"] = "cpu"
    if recipe["gpus"] > 1:  # Lightning DDP, one process per device (on the CPU: gloo, as in the tests)
        kwargs.update(devices=recipe["gpus"], strategy="ddp")
    return kwargs


# ------------------------------------------------------------------ main ----


def is_main_rank() -> bool:
    return all(os.environ.get(var, "0") == "0" for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def export_block(state_dir: Path, outdir: Path, start: int, end: int, run_info: dict[str, Any]) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(state_dir / "last.ckpt", outdir / "checkpoint.ckpt")
    shutil.copyfile(state_dir / "checkpoint_best_total.pth", outdir / "best.pth")
    rows = block_metrics(state_dir / "metrics.csv", start, end, outdir / "metrics.csv")
    write_json(outdir / "epochs.json", read_epoch_log(state_dir / "epochs.jsonl", start, end))
    write_json(outdir / "run.json", run_info)
    log.info("Block outputs written to %s (%d metrics rows)", outdir, rows)


def check_previous_block(previous_block: Path, recipe: Mapping[str, Any], run_id: str) -> Path:
    """The previous block's checkpoint, provided it was trained under this very recipe."""
    previous_run = read_json(previous_block / "run.json")
    if previous_run["recipe_id"] != run_id:
        raise StageError(
            f"The previous block ({previous_block}) was trained under another recipe "
            f"({recipe_diff(previous_run['recipe'], recipe)}); checkpoints made under another recipe are "
            "never resumed. To continue it, restore its settings (pin its GPU profile with "
            f"train.profile: {previous_run['profile']['name']}); to start over under the new recipe, run "
            "snakemake --cores all --forcerun train_block."
        )
    return previous_block / "checkpoint.ckpt"


def lock_state(state_dir: Path) -> FileLock:
    """One training process per state folder. The OS drops the lock when its holder dies, so it never goes
    stale; a second process (an earlier job still running, a second run of the workflow) stops at once."""
    lock = FileLock(str(state_dir / ".training.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout as error:
        raise StageError(
            f"Another training process is using {state_dir} (an earlier job that is still running, or a second "
            "snakemake in this folder). Wait for it to end or stop it, then run snakemake again."
        ) from error
    return lock


def prepare_state(state_dir: Path, plan: ResumePlan) -> None:
    if plan.checkpoint is None:
        for stale in state_dir.glob("*"):  # an earlier run under this recipe: start clean
            if stale.name not in ("recipe.json", ".training.lock"):
                stale.unlink() if stale.is_file() else shutil.rmtree(stale)
    truncate_metrics(state_dir / "metrics.csv", plan.next_epoch)


def set_host_threads(threads: int, device: Device) -> None:
    """CPU threads of this process's own torch operations on a GPU run (0 keeps torch's default). The data-loader
    workers are separate processes with one thread each; see config.yaml's train.host_threads for why 1 is
    faster. A CPU run computes the model itself on the host, so it keeps torch's default."""
    import torch

    if threads and device.kind == "cuda":
        torch.set_num_threads(threads)
    log.info("Host threads of the training process: %d", torch.get_num_threads())


def run_rfdetr(
    recipe: Mapping[str, Any], profile: Mapping[str, Any], kwargs: dict[str, Any], end: int, loader_niceness: int = 0
) -> None:
    """rfdetr's train() with our callbacks; a SIGTERM (a scheduler, a user) becomes a clear error."""
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.exceptions import SIGTERMException
    from rfdetr import RFDETRNano

    # rfdetr seeds inside train(), after the model is built: seed first so the random initialisation is
    # reproducible too (the same seed gives the same run).
    pl.seed_everything(recipe["seed"], workers=True)
    model = RFDETRNano(pretrain_weights=None, compile=profile["compile"], cuda_graphs=profile["cuda_graphs"])
    callbacks = lightning_callbacks(end, Path(kwargs["output_dir"]) / "epochs.jsonl")
    if profile["compile"] and profile["cuda_graphs"]:
        callbacks.append(static_cuda_graphs_callback())
    callbacks.append(freeze_after_warmup_callback())  # full garbage collections skip the compiled model's objects
    callbacks.append(next_epoch_during_validation_callback())  # no wait for the first batches of an epoch
    try:
        # Same values, less host work and no waits for the GPU within a step: the targets reach the GPU in one copy
        # per field; matching, the loss's box count, the learning-rate log and the EMA update are queued without
        # reading anything back; the loss gathers its matched targets per layer at once; the loader workers yield
        # their cores to this process and hand over images as bytes, normalised on the GPU; the deformable
        # attention samples with our Triton kernels; the matcher pads targets in two operations, not one copy per
        # image (scripts/<name>.py for each; measurements in BENCHMARKS.md).
        with (
            extra_callbacks(callbacks, single_node_ddp_plugins(recipe["gpus"])),
            targets_one_copy(),
            matches_on_device(),
            matching_without_waiting(),
            gather_matched_targets(),
            ema_without_waiting(),
            lr_log_on_device(),
            nice_loader_workers(loader_niceness),
            images_as_bytes(),
            deformable_sampling(),
            padding_in_one_copy(),
        ):
            model.train(**kwargs)
    except SIGTERMException as stop:  # Lightning's SystemExit, which would otherwise exit with status 0
        raise StageError(
            "Training was stopped by SIGTERM. The last completed epoch is saved; run snakemake again to resume."
        ) from stop


def train_block(args: argparse.Namespace, settings: Mapping[str, Any]) -> None:
    train = {**settings["train"], **json.loads(args.recipe)}
    start, end = args.start_epoch, args.end_epoch
    configure_compile_cache(args.state_root / "compile_cache")

    device = detect_device(train["device"])
    profile, reason = resolve_profile(settings["gpu_profiles"], device, train["profile"])
    profile, reason = settle_profile(profile, reason, device, train)
    log.info("Device: %s", device.describe())
    log.info("GPU profile: %s (%s): %s", profile["name"], reason, json.dumps(profile, sort_keys=True))
    log.info(INIT_NOTE)

    recipe = recipe_of(train, profile, rfdetr_version())
    run_id = recipe_id(recipe)
    state_dir = args.state_root / run_id
    log.info("Recipe %s: %s", run_id, json.dumps(recipe, sort_keys=True))
    previous = check_previous_block(args.previous_block, recipe, run_id) if args.previous_block else None
    main_rank = is_main_rank()  # under DDP, Lightning starts the other ranks by running this script again
    if main_rank:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_state(state_dir)  # held until this process ends  # noqa: F841
        write_json(state_dir / "recipe.json", recipe)

    state_last = state_dir / "last.ckpt"
    plan = plan_resume(state_last, checkpoint_epoch(state_last) if state_last.is_file() else None, previous, start, end)
    log.info("Epochs %d-%d of %d: %s", start + 1, end, recipe["epochs"], plan.note)
    if main_rank:
        prepare_state(state_dir, plan)
    stage = read_json(args.stage_report)
    if plan.next_epoch < end:
        kwargs = train_kwargs(recipe, stage["path"], state_dir, min(args.threads, train["max_workers"]), device)
        if plan.checkpoint is not None:
            kwargs["resume"] = str(plan.checkpoint)
        set_host_threads(train["host_threads"], device)
        run_rfdetr(recipe, profile, kwargs, end, train["loader_niceness"])
    if not main_rank:
        return
    if checkpoint_epoch(state_last) + 1 != end:
        raise StageError(f"Training stopped before epoch {end}; see the log above. Run snakemake again to resume.")
    run_info = {
        "recipe_id": run_id,
        "recipe": recipe,
        "profile": profile,
        "profile_reason": reason,
        "device": device.describe(),
        **where_this_runs(),
        "epochs": [start, end],
        "resumed_from": str(plan.checkpoint) if plan.checkpoint else None,
        "dataset": stage,
        "state_dir": str(state_dir),
        "initialisation": INIT_NOTE,
    }
    write_json(state_dir / "profile.json", {"profile": profile, "reason": reason, "device": device.describe()})
    export_block(state_dir, args.outdir, start, end, run_info)
    if end == recipe["epochs"] and settings["stage"]["remove_after_training"] and stage["where"] == "ramdisk":
        remove_staged(Path(settings["stage"]["ramdisk"]), settings["stage"]["subdir"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", required=True, help="JSON: the recipe settings of config.yaml's train section")
    parser.add_argument("--start-epoch", required=True, type=int)
    parser.add_argument("--end-epoch", required=True, type=int)
    parser.add_argument(
        "--previous-block", type=lambda s: Path(s) if s else None, help="output folder of the previous block"
    )
    parser.add_argument("--stage-report", required=True, type=Path, help="stage.json: where the dataset is")
    parser.add_argument("--state-root", required=True, type=Path)
    parser.add_argument("--outdir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    train_block(args, pipeline_config())


if __name__ == "__main__":
    run_main(main)

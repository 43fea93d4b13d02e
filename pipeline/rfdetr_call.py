"""rfdetr's `train()` call: the reference notebook's keyword arguments, plus what the workflow adds to them.

The notebook's call (dataset, epochs, batch, workers, seed, cosine schedule with warm-up, tqdm, precision, no gradient
accumulation, fixed 384 px) comes from the recipe and the GPU profile; the workflow adds the state folder as
`output_dir`, `resume`, the device, DDP for several GPUs, a validation batch of one shape, a checkpoint interval that
writes `last.ckpt` every epoch, and the loggers of `train.loggers` (the notebook turns TensorBoard off; the workflow
has it on by default). None of these changes what is trained. Shown by `tests/test_train.py` and, against
`bench/stock_recipe.py`, by `tests/test_pipeline.py::test_without_speedups_the_train_rule_gives_the_notebooks_losses`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common import StageError, log
from pipeline.dataset import count_images
from pipeline.gpu_profiles import (
    Device,
    batch_multiple,
    check_gpu_count,
    detect_device,
    resolve_profile,
    settle_profile,
)
from rfdetr_extensions import Selection, SpeedupOptions, applied, select_speedups

AMP_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp32": None}  # profile precision -> train(amp_dtype=)


def eval_batch_size(val_images: int, batch_size: int, ranks: int = 1, multiple: int = 1) -> int:
    """The validation batch for `val_images` images over `ranks` GPUs: at most the training batch, and a multiple of
    `multiple` (a route's shape rule, see `pipeline.gpu_profiles.batch_multiple`; 1: none).

    Among such sizes, the largest that divides each rank's share: every batch then has one shape and keeps the rule,
    and the compiled model does not recompile for a smaller last batch (COCO's 5,000 images at batch 128 would leave
    a last batch of 8). When no divisor comes within a quarter of the training batch, one extra compile beats many
    small batches: the training batch (or the share, if smaller), rounded down to the multiple. A share that is
    itself no multiple of `multiple` (an odd one such as 4,999 for the FP8 route's 2) leaves a last batch that no
    batch size keeps in the rule (`last_batch_off_the_rule`); the FP8 route runs that one batch without FP8
    (`rfdetr_extensions.fp8_validation`), so every image is still validated once. Shown by `tests/test_train.py`.
    """
    share = -(-val_images // ranks)
    limit = min(batch_size, share)
    dividing = [size for size in range(multiple, limit + 1, multiple) if share % size == 0]
    if dividing and dividing[-1] >= max(1, batch_size // 4):
        return dividing[-1]
    return max(multiple, limit - limit % multiple)


def last_batch_off_the_rule(val_images: int, batch: int, ranks: int = 1, multiple: int = 1) -> int:
    """The image count of each rank's last validation batch when it is no multiple of `multiple`, else 0 (every
    batch keeps the rule). rfdetr's validation loader keeps a last, smaller batch (no drop_last)."""
    share = -(-val_images // ranks)
    last = share % batch or batch
    return last if last % multiple else 0


def loader_workers(threads: int, ranks: int, max_workers: int) -> int:
    """Data-loader workers of each of a job's `ranks` DDP processes: the job's `threads` cores shared among them, at
    most `max_workers` (`train.max_workers`). Every rank starts a loader of its own, so a worker per core in each
    would put twice the workers on the cores with two GPUs. Shown by `tests/test_train.py`."""
    return min(threads // max(1, ranks), max_workers)


LOGGERS = ("csv", "tensorboard", "mlflow", "wandb")  # train.loggers; rfdetr always writes metrics.csv
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def check_loggers(loggers: Sequence[str]) -> None:
    """StageError naming the package to install for each logger in `loggers` that cannot be imported."""
    missing = [name for name in loggers if name in LOGGER_PACKAGES and importlib.util.find_spec(name) is None]
    if missing:
        packages = " ".join(LOGGER_PACKAGES[name] for name in missing)
        raise StageError(
            f"train.loggers names {', '.join(missing)}, which is not installed: pip install {packages} "
            "(or leave it out of train.loggers in config.yaml)."
        )


def logger_kwargs(loggers: Sequence[str], run_name: str) -> dict[str, Any]:
    """rfdetr's logger flags for `loggers`: TensorBoard writes into the state folder (one run across the blocks);
    W&B and MLflow name each block's run after the recipe id, in the project "rfdetr-coco2017"."""
    return {
        "tensorboard": "tensorboard" in loggers,
        "mlflow": "mlflow" in loggers,
        "wandb": "wandb" in loggers,
        "project": "rfdetr-coco2017",
        "run": run_name,
    }


def train_kwargs(
    recipe: Mapping[str, Any],
    dataset: str,
    state_dir: Path,
    workers: int,
    device: Device,
    loggers: Sequence[str] = ("csv",),
) -> dict:
    """Keyword arguments for rfdetr's `train()`: the reference notebook's call, plus resume, device and loggers."""
    val_images = count_images(Path(dataset) / "val2017")
    multiple = batch_multiple(recipe, recipe["resolution"])
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
        progress_bar="tqdm",
        amp_dtype=AMP_DTYPE[recipe["precision"]],
        grad_accum_steps=recipe["grad_accum_steps"],
        multi_scale=recipe["multi_scale"],
        square_resize_div_64=recipe["square_resize_div_64"],
        eval_interval=recipe["eval_interval"],
        eval_batch_size=eval_batch_size(val_images, recipe["batch_size"], recipe["gpus"], multiple),
        # last.ckpt is written every epoch only while checkpoint_interval > 1; the interval archives are not
        # needed (each block keeps its own checkpoint), so write at most one.
        checkpoint_interval=max(2, recipe["epochs"]),
        **logger_kwargs(loggers, state_dir.name),
    )
    log.info("Validation batch: %d images (pipeline.rfdetr_call.eval_batch_size)", kwargs["eval_batch_size"])
    off_the_rule = last_batch_off_the_rule(val_images, kwargs["eval_batch_size"], recipe["gpus"], multiple)
    if off_the_rule:
        log.info(
            "The last validation batch (%d per GPU) is no multiple of %d, as the FP8 layers need at %d px: it runs "
            "without FP8 (rfdetr_extensions.fp8_validation)",
            off_the_rule,
            multiple,
            recipe["resolution"],
        )
    if device.kind == "cpu":
        kwargs["device"] = "cpu"
    if recipe["gpus"] > 1:  # Lightning DDP, one process per device (on the CPU: gloo, as in the tests)
        kwargs.update(devices=recipe["gpus"], strategy="ddp")
    return kwargs


def single_node_ddp_plugins(gpus: int) -> list[Any]:
    """Inside a SLURM job, Lightning expects `srun` to have started one task per GPU; this workflow starts one
    process per job, so for several GPUs on one node Lightning must start the other ranks itself."""
    if gpus <= 1:
        return []
    from lightning_fabric.plugins.environments import LightningEnvironment

    return [LightningEnvironment()]


def configure_compile_cache(state_root: Path) -> None:
    """Keep torch.compile's caches with the run, in `state_root`/compile_cache, so a resumed job, the next block and
    the first block after the compile warm-up reuse them."""
    cache_dir = state_root / "compile_cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def set_host_threads(threads: int, device: Device, ranks: int = 1) -> None:
    """CPU threads of this process's own torch operations. On a GPU run, `threads` (0 keeps torch's default): the
    data-loader workers are separate processes with one thread each; see config.yaml's train.host_threads for why 1
    is faster. A CPU run computes the model itself on the host, so it keeps torch's default (one per core, or the
    job's threads under snakemake), shared among its `ranks` DDP processes: two ranks with a thread per core each
    overcommit the cores and run several times slower than one (`tests/test_slurm.py`'s DDP test checks the log)."""
    import torch

    if threads and device.kind == "cuda":
        torch.set_num_threads(threads)
    elif device.kind == "cpu" and ranks > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // ranks))
    log.info("Host threads of the training process: %d", torch.get_num_threads())


def load_for_inference(weights: Path) -> Any:
    """rfdetr's model from a block's `best.pth`, with torch.compile and CUDA graphs off, for the evaluate and export
    stages.

    A compiled run's checkpoint records `compile: true` and `cuda_graphs: true` in its model config, and
    `RFDETR.from_checkpoint` restores them. rfdetr 1.11.2's `evaluate()` then wraps the module it builds in
    torch.compile before it loads the weights, whose names lack the wrapper's `_orig_mod.` prefix, and stops with a
    RuntimeError (found by the H200 GPU test). One pass over the validation set would also pay the eval graph's cold
    compile (110.6 s on the H200, `bench/results/2026-12-01-validation/`). Shown by
    tests/test_pipeline.py::test_a_compiled_runs_weights_load_for_inference_with_compile_and_cuda_graphs_off and, on
    the GPU, tests/test_gpu.py::test_the_h200_row_as_a_user_gets_it_captures_and_replays_cuda_graphs.
    """
    from rfdetr.detr import RFDETR

    return RFDETR.from_checkpoint(str(weights), compile=False, cuda_graphs=False)


@dataclass(frozen=True)
class TrainingRoute:
    """How this machine trains: its device, the speedups selected for it and the installed rfdetr, and the GPU
    profile (settled: FP8 checked, CUDA graphs only where they can run) with the reason it was chosen."""

    device: Device
    speedups: Selection
    profile: dict[str, Any]
    reason: str


def training_route(
    train: Mapping[str, Any], profiles: Sequence[Mapping[str, Any]], rfdetr_version: str
) -> TrainingRoute:
    """The route the train stage takes on this machine, logged. The compile warm-up (`scripts/compile_warmup.py`)
    takes the same one, so that it compiles the graphs training will look up."""
    device = detect_device(train["device"])
    check_gpu_count(device, train["gpus"])
    speedups = select_speedups(train["speedups"], rfdetr_version, device_kind=device.kind)
    profile, reason = resolve_profile(profiles, device, train["profile"])
    static_graphs = "static_cuda_graphs" in speedups.names()
    profile, reason = settle_profile(profile, reason, device, train, static_graphs=static_graphs)
    log.info("Device: %s", device.describe())
    log.info("GPU profile: %s (%s): %s", profile["name"], reason, json.dumps(profile, sort_keys=True))
    for line in speedups.report():
        log.info("%s", line)
    return TrainingRoute(device, speedups, profile, reason)


def run_rfdetr(
    recipe: Mapping[str, Any], route: TrainingRoute, kwargs: dict[str, Any], end: int, train: Mapping[str, Any]
) -> None:
    """rfdetr's train() on `route` with the workflow's callbacks and the route's speedups, stopping after epoch
    `end`, with the how-to-run settings of `train` (host threads, loader niceness); a SIGTERM (a scheduler, a user)
    becomes a clear error."""
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.exceptions import SIGTERMException
    from rfdetr import RFDETRNano

    from rfdetr_extensions.callbacks.block_end import StopAtBlockEnd
    from rfdetr_extensions.callbacks.epoch_log import EpochLog
    from rfdetr_extensions.fp8_validation import validation_of_any_size
    from rfdetr_extensions.trainer_hook import extra_callbacks

    # rfdetr seeds inside train(), after the model is built: seed first so the random initialisation is
    # reproducible too (the same seed gives the same run).
    profile = route.profile
    set_host_threads(train["host_threads"], route.device, recipe["gpus"])
    options = SpeedupOptions(loader_niceness=train["loader_niceness"])
    pl.seed_everything(recipe["seed"], workers=True)
    model = RFDETRNano(pretrain_weights=None, compile=profile["compile"], cuda_graphs=profile["cuda_graphs"])
    workflow_callbacks = [StopAtBlockEnd(end), EpochLog(Path(kwargs["output_dir"]) / "epochs.jsonl")]
    plugins = single_node_ddp_plugins(recipe["gpus"])
    fp8 = profile["precision"] == "fp8"
    try:
        with (
            applied(route.speedups, options) as speedup_callbacks,
            extra_callbacks([*workflow_callbacks, *speedup_callbacks], plugins),
            validation_of_any_size(batch_multiple(profile, recipe["resolution"])) if fp8 else nullcontext(),
        ):
            model.train(**kwargs)
    except SIGTERMException as stop:  # Lightning's SystemExit, which would otherwise exit with status 0
        raise StageError(
            "Training was stopped by SIGTERM. The last completed epoch is saved; run snakemake again to resume."
        ) from stop

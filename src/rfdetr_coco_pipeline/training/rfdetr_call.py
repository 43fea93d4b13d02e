"""rfdetr's `train()` call: the reference notebook's keyword arguments, plus what the workflow adds to them.

The notebook's call (dataset, epochs, batch, workers, seed, cosine schedule with warm-up, tqdm, precision, no gradient
accumulation, fixed 384 px) comes from the run's recipe; the workflow adds the state folder as `output_dir`,
`resume`, the device, DDP for several GPUs, a validation batch of one shape, a checkpoint interval that writes
`last.ckpt` every epoch, and the loggers of `train.loggers` (the notebook turns TensorBoard off; the workflow has it
on by default). None of these changes what is trained.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from rfdetr_coco_pipeline.common import StageError, log
from rfdetr_coco_pipeline.data.dataset import count_images
from rfdetr_coco_pipeline.hooks import applied, hook_off_reason
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.callbacks import attached
from rfdetr_coco_pipeline.training.callbacks.block_end import StopAtBlockEnd
from rfdetr_coco_pipeline.training.callbacks.epoch_log import EpochLog
from rfdetr_coco_pipeline.training.callbacks.finite_loss import StopOnNonFiniteLoss
from rfdetr_coco_pipeline.training.fp8 import last_batch_off_the_rule
from rfdetr_coco_pipeline.training.recipe import model_settings, nodes_of
from rfdetr_coco_pipeline.training.route import Route

AMP_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp32": None}  # profile precision -> train(amp_dtype=)
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}  # rfdetr always writes csv
PROJECT = "rfdetr-coco2017"  # the W&B and MLflow project


def eval_batch_size(val_images: int, batch_size: int, ranks: int = 1, multiple: int = 1) -> int:
    """The validation batch for `val_images` images over `ranks` GPUs: at most the training batch, and a multiple of
    `multiple` (the route's batch rule; 1: none).

    Among such sizes, the largest that divides each rank's share: every batch then has one shape and keeps the rule,
    and the compiled model does not recompile for a smaller last batch. When no divisor comes within a quarter of the
    training batch, one extra compile beats many small batches: the training batch (or the share, if smaller),
    rounded down to the multiple."""
    share = -(-val_images // ranks)
    limit = min(batch_size, share)
    dividing = [size for size in range(multiple, limit + 1, multiple) if share % size == 0]
    if dividing and dividing[-1] >= max(1, batch_size // 4):
        return dividing[-1]
    return max(multiple, limit - limit % multiple)


def loader_workers(threads: int, ranks: int, max_workers: int) -> int:
    """Data-loader workers of each of a job's `ranks` DDP processes: the job's `threads` cores shared among them, at
    most `max_workers`. Every rank starts a loader of its own, so a worker per core in each would put twice the
    workers on the cores with two GPUs."""
    return min(threads // max(1, ranks), max_workers)


def check_loggers(loggers: Sequence[str]) -> None:
    """StageError naming the package to install for each logger in `loggers` that cannot be imported."""
    missing = [name for name in loggers if name in LOGGER_PACKAGES and importlib.util.find_spec(name) is None]
    if missing:
        packages = " ".join(LOGGER_PACKAGES[name] for name in missing)
        raise StageError(
            f"train.loggers names {', '.join(missing)}, which is not installed: pip install {packages} "
            "(or leave it out of train.loggers in config.yaml)."
        )


def train_kwargs(
    recipe: Mapping[str, Any],
    route: Route,
    dataset: Path,
    state_dir: Path,
    workers: int,
    loggers: Sequence[str] = ("csv",),
) -> dict[str, Any]:
    """Keyword arguments for rfdetr's `train()` for the run's `recipe` (`recipe.run_recipe`) on `route`.

    TensorBoard writes into the state folder, so one run spans the blocks; W&B and MLflow name each block's run
    after the recipe id."""
    val_images = count_images(dataset / "val2017")
    gpus, nodes = recipe["gpus"], nodes_of(recipe)
    kwargs: dict[str, Any] = dict(
        dataset_file="coco",
        dataset_dir=str(dataset),
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
        eval_batch_size=eval_batch_size(val_images, recipe["batch_size"], gpus * nodes, route.batch_multiple),
        # last.ckpt is written every epoch only while checkpoint_interval > 1; the interval archives are not
        # needed (each block keeps its own checkpoint), so write at most one.
        checkpoint_interval=max(2, recipe["epochs"]),
        tensorboard="tensorboard" in loggers,
        mlflow="mlflow" in loggers,
        wandb="wandb" in loggers,
        project=PROJECT,
        run=state_dir.name,
    )
    log.info("Validation batch: %d images", kwargs["eval_batch_size"])
    if route.device.kind == "cpu":
        kwargs["device"] = "cpu"
    if gpus * nodes > 1:  # Lightning DDP, one process per device (on the CPU: gloo)
        kwargs.update(devices=gpus, num_nodes=nodes, strategy="ddp")
    return kwargs


def configure_compile_cache(state_root: Path) -> None:
    """Keep torch.compile's caches with the run, in `state_root`/compile_cache, so a resumed job, the next block and
    the first block after the compile warm-up reuse them."""
    cache_dir = state_root / "compile_cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def set_host_threads(threads: int, device_kind: str, ranks: int = 1) -> None:
    """CPU threads of this process's own torch operations. On a GPU run, `threads` (0 keeps torch's default): the
    data-loader workers are separate processes, and rfdetr's many small host operations per step run faster on one
    thread than on a team of one per core beside busy workers. A CPU run computes the model on the host, so it keeps
    torch's default, shared among its `ranks` DDP processes: two ranks with a thread per core each overcommit the
    cores and run several times slower than one."""
    import torch

    if threads and device_kind == "cuda":
        torch.set_num_threads(threads)
    elif device_kind == "cpu" and ranks > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // ranks))
    log.info("Host threads of the training process: %d", torch.get_num_threads())


def trainer_plugins_for(settings: Settings) -> list[Any]:
    """The Lightning plugins the workflow adds to rfdetr's Trainer: checkpoints written durably
    (`checkpoints.DurableCheckpointIO`), and for several ranks the cluster environment that says who started them.
    Lightning's launch: the environment in which Lightning starts the other ranks itself (inside a SLURM job it
    would otherwise expect srun to have started one task per GPU). srun's launch: SLURM's, which takes each task's
    rank from SLURM_PROCID and SLURM_LOCALID, without Lightning's own requeue: a warned job stops, and Snakemake
    resubmits it (docs/cluster.md). None when the `trainer_plugins` hook is off."""
    from lightning_fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

    from rfdetr_coco_pipeline.training.checkpoints import DurableCheckpointIO

    if hook_off_reason("trainer_plugins"):
        return []
    if settings.srun_launch:
        return [DurableCheckpointIO(), SLURMEnvironment(auto_requeue=False)]
    return [DurableCheckpointIO(), *([LightningEnvironment()] if settings.recipe.gpus > 1 else [])]


def fp8_validation(settings: Settings, route: Route, kwargs: Mapping[str, Any]) -> Any:
    """On the FP8 route, the hook that runs a last validation batch off the FP8 rule without FP8, where the set
    leaves one; a no-op context otherwise. StageError when such a batch is due and the hook is off."""
    if route.profile.precision != "fp8":
        return nullcontext()
    images = count_images(Path(kwargs["dataset_dir"]) / "val2017")
    last = last_batch_off_the_rule(images, kwargs["eval_batch_size"], settings.recipe.ranks, route.batch_multiple)
    if not last:
        return nullcontext()
    log.info("The last validation batch (%d per GPU) breaks the FP8 layers' rule: it runs without FP8", last)
    if why := hook_off_reason("fp8_validation"):
        raise StageError(
            f"The last validation batch of {images} images ({last} per GPU) breaks Transformer Engine's FP8 shape "
            f"rule, and the hook that runs it without FP8 is off ({why}). Pin a bf16 profile (train.profile), or "
            "install the rfdetr the workflow pins (pip install -e .)."
        )
    from rfdetr_coco_pipeline.hooks.fp8_validation import validation_of_any_size

    return validation_of_any_size(route.batch_multiple)


def sigterm_handling(settings: Settings) -> AbstractContextManager[Any]:
    """With several ranks, the hook that stops every rank at one step on SIGTERM; a no-op context for one rank, or
    when the hook is off (then Lightning's own handling, which the log names)."""
    if settings.recipe.ranks == 1 or hook_off_reason("sigterm_at_one_step"):
        return nullcontext()
    from rfdetr_coco_pipeline.hooks.sigterm_at_one_step import sigterm_at_one_step

    return sigterm_at_one_step()


def run_rfdetr(settings: Settings, route: Route, kwargs: dict[str, Any], end: int) -> None:
    """rfdetr's `train(**kwargs)` on `route`, with the workflow's callbacks and the route's speedups, stopping after
    epoch `end`; a SIGTERM (a scheduler, a user) becomes a clear error."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.utilities.exceptions import SIGTERMException
    from rfdetr import RFDETRNano

    from rfdetr_coco_pipeline.hooks.trainer_plugins import trainer_plugins

    profile, gpus = route.profile, settings.recipe.gpus
    set_host_threads(settings.train.host_threads, route.device.kind, gpus)
    # rfdetr seeds inside train(), after the model is built: seed first so that the random initialisation is
    # reproducible too.
    pl.seed_everything(settings.recipe.seed, workers=True)
    model = RFDETRNano(
        pretrain_weights=None, compile=profile.compile, cuda_graphs=profile.cuda_graphs, **model_settings(profile)
    )
    epoch_log = EpochLog(Path(kwargs["output_dir"]) / "epochs.jsonl")
    workflow_callbacks = [StopOnNonFiniteLoss(), StopAtBlockEnd(end), epoch_log]
    # The always-on hooks pass the gate before any speedup is in place: a speedup that wraps one of their targets
    # (checkpoints_in_background wraps build_trainer) must not read to the gate as a changed release.
    plugins, odd_validation_batch = trainer_plugins_for(settings), fp8_validation(settings, route, kwargs)
    stop_on_sigterm = sigterm_handling(settings)
    try:
        with (
            applied(route.speedups, settings.train) as speedup_callbacks,
            attached([*workflow_callbacks, *speedup_callbacks]),
            trainer_plugins(plugins),
            odd_validation_batch,
            stop_on_sigterm,
        ):
            model.train(**kwargs)
    except SIGTERMException as stop:  # Lightning's SystemExit, which would otherwise exit with status 0
        raise StageError(
            "Training was stopped by SIGTERM. The last completed epoch is saved; run snakemake again to resume."
        ) from stop
    except torch.OutOfMemoryError as error:
        raise StageError(out_of_memory_advice(route, str(error))) from error


def out_of_memory_advice(route: Route, error: str) -> str:
    """What a user reads when the GPU runs out of memory: what happened, and what to change."""
    profile = route.profile
    return (
        f"The GPU ran out of memory ({error.splitlines()[0] if error else 'CUDA out of memory'}) training with the "
        f"GPU profile {profile.name!r} (batch_size {profile.batch_size} per GPU, on {route.device.describe()}). "
        "Pin a gpu_profiles row with a smaller batch_size (train.profile), or add a row of your own to "
        "gpu_profiles in config.yaml; another process holding the GPU's memory has the same effect. The batch "
        "size is part of the recipe: the run then starts anew and does not resume this one's checkpoints. The last "
        "completed epoch of this run stays saved."
    )


def load_for_inference(weights: Path) -> Any:
    """rfdetr's model from a block's `best.pth`, with torch.compile and CUDA graphs off, for the evaluate and export
    stages. A compiled run's checkpoint records `compile: true` and `from_checkpoint` restores it; rfdetr's
    `evaluate()` would then wrap the module in torch.compile before loading weights whose names lack the wrapper's
    prefix, and stop. One pass over the validation set also gains less than a cold compile costs."""
    from rfdetr.detr import RFDETR

    return RFDETR.from_checkpoint(str(weights), compile=False, cuda_graphs=False)

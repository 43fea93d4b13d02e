"""What a run needs from the machine, said before anything is downloaded.

- `needs_summary`: what a run prints as it starts: disk needed against free, room on the RAM disk, the GPU found
  here, and the time the jobs ask of a scheduler (`resources.*`).
- `training_job_cores`: the cores a training job asks for: `train.max_workers` per GPU (16 on a CPU run).
- `check_gpus`: the check_gpus job, which runs where training will run, before the first download: the training
  job's own error for a missing GPU or for fewer GPUs than `train.gpus`, before 19 GB are fetched rather than after.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rfdetr_coco_pipeline.blocks import run_blocks
from rfdetr_coco_pipeline.common import StageError, size
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.device import check_gpu_count, detect_device
from rfdetr_coco_pipeline.versions import nvidia_smi_query

CPU_RUN_CORES = 16  # a CPU run computes the model on the host: as many cores as the other CPU-heavy rules ask


def existing_parent(path: Path) -> Path:
    """`path`, or its nearest folder that exists (where its files would go)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def disk_needed(settings: Settings) -> int:
    """Bytes the data still needs on disk at its peak: the files of each archive not yet extracted, and the archives
    themselves (all of them with extract.keep_archives, else the largest, which is deleted once extracted)."""
    pending = [archive for archive in settings.archives if not (settings.paths.dataset / archive.folder).is_dir()]
    archives = [archive.size_bytes for archive in pending]
    kept = sum(archives) if settings.extract.keep_archives else max(archives, default=0)
    return sum(archive.extracted_bytes for archive in pending) + kept


def gpus_here() -> str:
    """The NVIDIA GPUs of this machine, as nvidia-smi lists them."""
    gpus = nvidia_smi_query("name,memory.total")
    if not gpus:
        return "none found here"
    return f"{len(gpus)} x {gpus[0]}" if len(set(gpus)) == 1 else ", ".join(gpus)


def needs_summary(settings: Settings) -> str:
    """A few lines: disk, RAM disk, GPU, and the time the jobs ask for."""
    free = shutil.disk_usage(existing_parent(settings.data_dir)).free
    needed = disk_needed(settings)
    stage = settings.stage
    dataset_bytes = sum(archive.extracted_bytes for archive in settings.archives)
    if not stage.enabled:
        ram = "staging is off (stage.enabled)"
    elif not stage.ramdisk.is_dir():
        ram = f"{stage.ramdisk} does not exist here: training will read the disk copy"
    else:
        room = shutil.disk_usage(stage.ramdisk).free
        fits = room >= dataset_bytes + stage.headroom_gb * 2**30
        ram = f"{size(room)} free in {stage.ramdisk} for a {size(dataset_bytes)} copy: " + (
            "it fits" if fits else "too small, training will read the disk copy"
        )
    resources = settings.resources
    blocks = run_blocks(settings).values()
    train_hours = sum(30 + resources.train_minutes_per_epoch * (end - start) for start, end in blocks) / 60
    lines = [
        "What this run needs:",
        f"  disk: {size(needed)} more at the peak for the data in {settings.data_dir}, {size(free)} free there"
        + ("" if needed <= free else "  <- NOT ENOUGH"),
        f"  RAM disk: {ram}",
        f"  GPU: {gpus_here()}" + (" (train.device: cpu)" if settings.train.device == "cpu" else ""),
        f"  time asked of a scheduler: {train_hours:.1f} h for {len(blocks)} training block(s) "
        f"(resources.train_minutes_per_epoch: {resources.train_minutes_per_epoch}, plus 30 min each), "
        f"{resources.evaluate_minutes} min for the evaluation; downloads depend on your network",
    ]
    return "\n".join(lines)


def training_job_cores(settings: Settings) -> int:
    """The cores a training job asks for. On a GPU, `train.max_workers` per GPU, so that each DDP rank's data loader
    gets as many workers as one GPU's would (the notebook's min(cores, 16)), and at least one core per rank; on the
    CPU, `CPU_RUN_CORES`, which the ranks' model computation shares. Snakemake caps it at `--cores` on one machine;
    on SLURM it is the job's --cpus-per-task."""
    if settings.train.device == "cpu":
        return CPU_RUN_CORES
    return max(1, settings.train.max_workers) * settings.recipe.gpus


def training_launch_resources(settings: Settings) -> dict[str, Any]:
    """The training job's resources that say how its processes start, in the SLURM executor plugin's terms.

    Lightning's launch (one node): `gpu`, the job's GPU count (the plugin's --gpus; Snakemake's own count on one
    machine). srun: `nodes`; `gres` gpu:N, which SLURM counts per node (the plugin's --gpus counts the whole job);
    one task per GPU, as `tasks_per_node` (`tasks` with one GPU a node, where the plugin refuses one task a node);
    `cpus_per_task`, the job's cores shared among a node's tasks; and `mpi`, the launcher the rule starts the stage
    and the ranks with. With `mpi` the plugin runs the job's command once, in the batch step, where srun can start
    the tasks on every node; without it the command would itself be a single srun task."""
    recipe = settings.recipe
    if not settings.srun_launch:
        return {"gpu": recipe.gpus}
    launch: dict[str, Any] = {"nodes": recipe.nodes, "mpi": "srun"}
    if settings.train.device == "cuda":
        launch["gres"] = f"gpu:{recipe.gpus}"
    if recipe.gpus > 1:
        launch["tasks_per_node"] = recipe.gpus
    else:
        launch.update(tasks=recipe.ranks, tasks_per_gpu=1)
    launch["cpus_per_task"] = lambda wildcards, threads: max(1, threads // recipe.gpus)
    return launch


def checks_gpus(settings: Settings) -> bool:
    """Whether the check_gpus job looks for GPUs (`preflight` on a GPU run), rather than only saying it did not."""
    return settings.preflight and settings.train.device == "cuda"


def check_gpus(settings: Settings) -> dict[str, Any]:
    """The check_gpus job's report: the GPUs found, or why none were looked for. StageError with the training job's
    own message when the GPUs training needs are not there."""
    if not checks_gpus(settings):
        why = "preflight: false" if not settings.preflight else "train.device: cpu"
        return {"checked": False, "reason": why}
    try:
        device = detect_device("cuda")
        check_gpu_count(device, settings.recipe.gpus)
    except StageError as error:
        raise StageError(
            f"{error} Checked before the first download, where training will run, since training would stop there; "
            "to run the jobs before it anyway (the download, say), add --config preflight=false."
        ) from error
    return {"checked": True, "device": device.describe()}

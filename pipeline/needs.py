"""What a run needs from the machine, said before anything is downloaded.

- `needs_summary`: what `snakemake -n` prints: disk needed against free, room on the RAM disk, the GPU found here,
  and the time the jobs ask of a scheduler (`resources.*`).
- `training_job_cores`: the cores a training job asks for: `train.max_workers` per GPU (16 on a CPU run).
- `gpu_preflight`: when jobs run on this machine and training is due on a GPU, the train job's own error for a
  missing GPU or for fewer GPUs than `train.gpus`, before the first download rather than after 19 GB of it
  (`preflight: false` skips it).

Shown by `tests/test_faults.py` (the preflight), `tests/test_gpu.py` (on a GPU: too few of them) and
`tests/test_config.py` (the dry run's summary).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.blocks import block_ranges
from pipeline.common import StageError, size
from pipeline.gpu_profiles import check_gpu_count, detect_device


def existing_parent(path: Path) -> Path:
    """`path`, or its nearest folder that exists (where its files would go)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def disk_needed(config: Mapping[str, Any]) -> int:
    """Bytes the data still needs on disk at its peak: the files of each archive not yet extracted, and the archives
    themselves (all of them with extract.keep_archives, else the largest, which is deleted once extracted)."""
    dataset = Path(config["data_dir"]) / "coco2017"
    pending = [a for a in config["archives"].values() if not (dataset / a["folder"]).is_dir()]
    archives = [a["size_bytes"] for a in pending]
    kept = sum(archives) if config["extract"]["keep_archives"] else max(archives, default=0)
    return sum(a["extracted_bytes"] for a in pending) + kept


def gpu_here() -> str:
    try:
        device = detect_device("cuda")
    except StageError:
        return "none found here"
    return device.describe()


def needs_summary(config: Mapping[str, Any]) -> str:
    """A few lines: disk, RAM disk, GPU, and the time the jobs ask for."""
    data = existing_parent(Path(config["data_dir"]))
    free = shutil.disk_usage(data).free
    needed = disk_needed(config)
    stage = config["stage"]
    dataset_bytes = sum(archive["extracted_bytes"] for archive in config["archives"].values())
    ramdisk = Path(stage["ramdisk"])
    if not stage["enabled"]:
        ram = "staging is off (stage.enabled)"
    elif not ramdisk.is_dir():
        ram = f"{ramdisk} does not exist here: training will read the disk copy"
    else:
        room = shutil.disk_usage(ramdisk).free
        fits = room >= dataset_bytes + stage["headroom_gb"] * 2**30
        ram = f"{size(room)} free in {ramdisk} for a {size(dataset_bytes)} copy: " + (
            "it fits" if fits else "too small, training will read the disk copy"
        )
    train, resources = config["train"], config["resources"]
    blocks = block_ranges(train["epochs"], train["epochs_per_block"])
    train_hours = sum(30 + resources["train_minutes_per_epoch"] * (end - start) for start, end in blocks) / 60
    lines = [
        "What this run needs:",
        f"  disk: {size(needed)} more at the peak for the data in {Path(config['data_dir'])}, {size(free)} free there"
        + ("" if needed <= free else "  <- NOT ENOUGH"),
        f"  RAM disk: {ram}",
        f"  GPU: {gpu_here()}" + (" (train.device: cpu)" if train["device"] == "cpu" else ""),
        f"  time asked of a scheduler: {train_hours:.1f} h for {len(blocks)} training block(s) "
        f"(resources.train_minutes_per_epoch: {resources['train_minutes_per_epoch']}, plus 30 min each), "
        f"{resources['evaluate_minutes']} min for the evaluation; downloads depend on your network",
    ]
    return "\n".join(lines)


CPU_RUN_CORES = 16  # a CPU run computes the model on the host: as many cores as the other CPU-heavy rules ask


def training_job_cores(train: Mapping[str, Any]) -> int:
    """The cores a training job asks for. On a GPU, `train.max_workers` per GPU, so that each DDP rank's data loader
    gets as many workers as one GPU's would (the notebook's min(cores, 16)), and at least one core per rank; on the
    CPU, `CPU_RUN_CORES`, which the ranks' model computation shares. Snakemake caps it at `--cores` on one machine;
    on SLURM it is the job's --cpus-per-task. Shown by `tests/test_train.py`."""
    if train["device"] == "cpu":
        return CPU_RUN_CORES
    return max(1, train["max_workers"]) * train["gpus"]


def gpu_preflight(config: Mapping[str, Any], rules_due: set[str]) -> str | None:
    """The train job's message for a missing GPU, or for fewer GPUs than train.gpus, when a job that needs them is
    due on this machine; else None."""
    if not config.get("preflight", True) or config["train"]["device"] != "cuda":
        return None
    if not rules_due & {"compile_warmup", "train_block", "evaluate"}:
        return None
    try:
        device = detect_device("cuda")
        if rules_due & {"compile_warmup", "train_block"}:
            check_gpu_count(device, config["train"]["gpus"])
    except StageError as error:
        return (
            f"{error} Checked before any job starts, since training would stop there; to run the jobs before it "
            "anyway (the download, say), add --config preflight=false."
        )
    return None

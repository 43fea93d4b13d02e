# What the rules share: the validated settings, the paths, the blocks, and the input functions.
import json
import os
import sys
import time
from pathlib import Path

from snakemake.exceptions import WorkflowError

# This checkout's package, for this file and (through PYTHONPATH) for its jobs, whichever copy is installed.
SOURCE = Path(workflow.basedir) / "src"
sys.path.insert(0, str(SOURCE))
from rfdetr_coco_pipeline.blocks import run_blocks
from rfdetr_coco_pipeline.config_check import ConfigError
from rfdetr_coco_pipeline.data.download import checked_md5
from rfdetr_coco_pipeline.end_of_run import failure_summary, success_summary
from rfdetr_coco_pipeline.export import missing_message, missing_modules
from rfdetr_coco_pipeline.needs import (
    checks_gpus,
    needs_summary,
    training_job_cores,
    training_launch_resources,
)
from rfdetr_coco_pipeline.settings import RUN_STARTED_ENV, SETTINGS_ENV, load_settings

try:
    SETTINGS = load_settings(
        config,
        Path(workflow.basedir) / "schemas" / "config.schema.yaml",
        Path("config.yaml"),
    )
except ConfigError as error:
    raise WorkflowError(str(error)) from None
# Said now, not after hours of training: the export stage would stop on it.
for fmt in SETTINGS.export.formats:
    if missing := missing_modules(fmt):
        print(f"Warning: {missing_message(fmt, missing)}", file=sys.stderr)

# A rule's shell runs `<stage>.py` of scripts/ (first on PATH) with the `python3` of the interpreter running
# snakemake (a conda env, when used, is activated in the job's shell and comes first) and this checkout's package.
# Jobs read the settings validated above from the environment, not from params: changing how a run goes never
# reruns a finished job.
os.environ.update(
    PATH=os.pathsep.join(
        [
            str(Path(workflow.basedir) / "scripts"),
            str(Path(sys.executable).parent),
            os.environ.get("PATH", ""),
        ]
    ),
    PYTHONPATH=os.pathsep.join(
        filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")])
    ),
)
os.environ[SETTINGS_ENV] = SETTINGS.model_dump_json()
os.environ.setdefault(RUN_STARTED_ENV, str(time.time()))

PATHS = SETTINGS.paths
DATASET = PATHS.dataset
RESULTS = PATHS.results
LOGS = RESULTS / "logs"
BENCHMARKS = RESULTS / "benchmarks"
TRAIN = PATHS.train
EVAL = RESULTS / "eval"
EXPORT = RESULTS / "export"
# Beside the data it guards: once the data is there, a new results folder has no download to check before.
GPU_CHECK = PATHS.data / "preflight" / "gpus.json"
# The report's first page once the run has finished (the Snakefile's report: directive), its description before.
FRONT_PAGE = RESULTS / "report" / "front.rst"

ARCHIVE_NAMES = [archive.name for archive in SETTINGS.archives]
FOLDERS = [archive.folder for archive in SETTINGS.archives]
BLOCKS = run_blocks(SETTINGS)
BLOCK_OUTPUTS = [
    "checkpoint.ckpt",
    "best.pth",
    "metrics.csv",
    "epochs.json",
    "run.json",
    "stage.json",
]
# The settings that shape the trained weights: as a parameter of the training rules, a change reruns training.
RECIPE = SETTINGS.recipe.as_parameter()
ON_GPU = SETTINGS.train.device == "cuda"


wildcard_constraints:
    archive="|".join(ARCHIVE_NAMES),
    folder="|".join(FOLDERS),
    block="|".join(BLOCKS),
    format="|".join(SETTINGS.export.formats) or "none",


def runs_here(rule_name):
    """Through a cluster executor, the rules of cluster.local_rules run where snakemake runs (most compute nodes
    cannot reach the internet); without one, every rule does."""
    return rule_name in SETTINGS.cluster.local_rules


def archive_path(name):
    return str(PATHS.archives / f"{name}.zip")


# An archive in data_dir that no download of this workflow wrote was placed there by hand: the download rule does
# not make it, so Snakemake never deletes it, and extraction checks its MD5 before using it.
PLACED_BY_HAND = [
    name
    for name in ARCHIVE_NAMES
    if Path(archive_path(name)).is_file()
    and checked_md5(Path(archive_path(name))) is None
]
DOWNLOADED_ARCHIVES = (
    "|".join(n for n in ARCHIVE_NAMES if n not in PLACED_BY_HAND) or "(?!)"
)


def download_after(wildcards):
    """The first archive is fetched once the GPUs are checked; each later one after the previous one is extracted
    (and deleted). ancient(): only the order matters; redoing an earlier step must not refetch the later ones.

    Data extracted without a check (by an earlier release, or copied in) keeps its download's inputs as they were:
    Snakemake reruns a job whose set of inputs changed.
    """
    index = ARCHIVE_NAMES.index(wildcards.archive)
    if index > 0:
        return ancient(DATASET / FOLDERS[index - 1])
    if GPU_CHECK.exists() or not (DATASET / FOLDERS[0]).exists():
        return ancient(GPU_CHECK)
    return []


def block_outputs(block):
    return {Path(name).stem: str(TRAIN / block / name) for name in BLOCK_OUTPUTS}


def last_block_output(name):
    return str(TRAIN / list(BLOCKS)[-1] / name)


def previous_block(wildcards):
    names = list(BLOCKS)
    index = names.index(wildcards.block)
    return block_outputs(names[index - 1]) if index else {}


def compile_warmup_report(wildcards):
    """The first block of a GPU run waits for the compile warm-up when train2017 has yet to be extracted, so that
    the warm-up runs beside its download. With the data already there nothing would hide it, and it would delay
    training by about as much as it saves.

    A report already written keeps the block's inputs as they were when it trained, in later runs too: Snakemake
    reruns a job whose set of inputs changed. ancient(): a warm-up run again must not retrain by itself.
    """
    warmup_report = TRAIN / "compile_warmup.json"
    first = wildcards.block == next(iter(BLOCKS))
    wanted = SETTINGS.train.compile_warmup and ON_GPU
    if (
        first
        and wanted
        and (warmup_report.exists() or not (DATASET / "train2017").exists())
    ):
        return ancient(str(warmup_report))
    return []


def train_mem_mb(wildcards):
    staged = sum(archive.extracted_bytes for archive in SETTINGS.archives) // 10**6
    return SETTINGS.resources.train_mem_mb + (staged if SETTINGS.stage.enabled else 0)


def train_runtime(wildcards):
    start, end = BLOCKS[wildcards.block]
    return int(30 + SETTINGS.resources.train_minutes_per_epoch * (end - start))


def final_targets():
    return [
        *block_outputs(list(BLOCKS)[-1]).values(),
        str(RESULTS / "metrics.csv"),
        str(RESULTS / "plots" / "training.png"),
        str(RESULTS / "plots" / "loss.png"),
        str(RESULTS / "plots" / "map.png"),
        str(RESULTS / "plots" / "summary.txt"),
        str(RESULTS / "report" / "epochs.html"),
        str(RESULTS / "report" / "run.html"),
        str(FRONT_PAGE),
        str(EVAL / "metrics.json"),
        str(EVAL / "metrics.html"),
        str(EVAL / "per_class.csv"),
        str(EVAL / "per_class.png"),
        *(str(EXPORT / f"model.{fmt}") for fmt in SETTINGS.export.formats),
    ]


onstart:
    # Jobs are about to run (a dry run shows the jobs alone).
    print(needs_summary(SETTINGS), file=sys.stderr)


onsuccess:
    print(success_summary(SETTINGS), file=sys.stderr)


onerror:
    print(failure_summary(log), file=sys.stderr)

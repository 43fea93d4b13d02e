import json
import os
import re
import sys
from pathlib import Path

from snakemake.common.configfile import load_configfile
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

sys.path.insert(0, workflow.basedir)
from pipeline.blocks import block_name, block_ranges
from pipeline.common import CONFIG_ENV, REFETCH_ENV
from pipeline.config_check import (
    ConfigError,
    coerce_to_schema,
    load_schema,
    validate_config,
)
from pipeline.export_formats import missing_message, missing_modules
from pipeline.needs import gpu_preflight, needs_summary, training_job_cores
from pipeline.recipe import RECIPE_KEYS

SCHEMA = Path(workflow.basedir) / "schemas" / "config.schema.yaml"
# `--config 'train={"epochs": 20}'` arrives as {"epochs": "20"}: the schema says what each string stands for.
config.update(coerce_to_schema(dict(config), load_schema(SCHEMA)))
CONFIG_SOURCES = [
    *((str(path), load_configfile(path)) for path in workflow.configfiles),
    *(
        (f"--configfile {path}", load_configfile(path))
        for path in workflow.config_settings.configfiles
    ),
    ("--config", dict(workflow.config_settings.config)),
]
try:
    validate_config(config, SCHEMA, CONFIG_SOURCES)
except ConfigError as error:
    raise WorkflowError(str(error)) from None
# Said now, not after hours of training: the export stage would stop on it.
for fmt in config["export"]["formats"]:
    if missing := missing_modules(fmt):
        logger.warning(f"Warning: {missing_message(fmt, missing)}")

# Rules run `python -m scripts.<stage>`: that must be the interpreter running snakemake (a conda env,
# when used, is activated in the job's shell and comes first), with this folder importable.
os.environ.update(
    PATH=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    ),
    PYTHONPATH=os.pathsep.join(
        filter(None, [workflow.basedir, os.environ.get("PYTHONPATH")])
    ),
)
# How-to-run settings reach the scripts through the environment, not params: changing them never
# reruns a finished job (see pipeline/common.py: pipeline_config).
os.environ[CONFIG_ENV] = json.dumps(config)
# A download kept aside for a wrong MD5 is fetched again only when the user asked for it (scripts/download.py). A
# cluster job's own snakemake (told its job with --target-jobs, and always --force) keeps what the user's run set.
FORCING = ("--forcerun", "-R", "--forceall", "-F", "--force", "-f")
if "--target-jobs" not in sys.argv:
    os.environ[REFETCH_ENV] = str(int(any(arg in FORCING for arg in sys.argv)))


# Through a cluster executor these rules run on the machine where snakemake runs, not on a compute node: most
# clusters' compute nodes cannot reach the internet (config.yaml: cluster.local_rules).
workflow.localrules(
    *config["cluster"]["local_rules"]
)  # the `localrules:` directive, for a list from the config


DATA = Path(config["data_dir"])
ARCHIVES = DATA / "archives"
DATASET = DATA / "coco2017"
RESULTS = Path(config["results_dir"])
LOGS = RESULTS / "logs"
BENCHMARKS = RESULTS / "benchmarks"
TRAIN = RESULTS / "train"
EVAL = RESULTS / "eval"
EXPORT = RESULTS / "export"

ARCHIVE_NAMES = list(config["archives"])
FOLDERS = [config["archives"][name]["folder"] for name in ARCHIVE_NAMES]
ARCHIVE_OF_FOLDER = dict(zip(FOLDERS, ARCHIVE_NAMES))
BLOCKS = {
    block_name(i + 1): epochs
    for i, epochs in enumerate(
        block_ranges(config["train"]["epochs"], config["train"]["epochs_per_block"])
    )
}
BLOCK_OUTPUTS = [
    "checkpoint.ckpt",
    "best.pth",
    "metrics.csv",
    "epochs.json",
    "run.json",
    "stage.json",
]
# Settings that shape the trained weights (pipeline/recipe.py): a change reruns training.
RECIPE = {key: config["train"][key] for key in RECIPE_KEYS}


wildcard_constraints:
    archive="|".join(ARCHIVE_NAMES),
    folder="|".join(FOLDERS),
    block="|".join(BLOCKS),
    format="|".join(config["export"]["formats"]) or "none",


def archive_path(name):
    return str(ARCHIVES / f"{name}.zip")


def previous_extraction(wildcards):
    """Download archives one at a time, each after the previous one is extracted (and deleted).

    ancient(): only the order matters; re-extracting an earlier archive must not refetch the later ones.
    """
    index = ARCHIVE_NAMES.index(wildcards.archive)
    if index == 0:
        return []
    return ancient(DATASET / config["archives"][ARCHIVE_NAMES[index - 1]]["folder"])


def block_outputs(block):
    return {Path(name).stem: str(TRAIN / block / name) for name in BLOCK_OUTPUTS}


def last_block_output(name):
    return str(TRAIN / list(BLOCKS)[-1] / name)


def previous_block(wildcards):
    names = list(BLOCKS)
    index = names.index(wildcards.block)
    return block_outputs(names[index - 1]) if index else {}


def compile_warmup_report(wildcards):
    """The first block of a GPU run waits for the compile warm-up (rules/compile_warmup.smk) when train2017 has yet
    to be extracted, so that the warm-up runs beside its download. With the data already there nothing would hide it,
    and it would delay training by about as much as it saves (BENCHMARKS.md, "The start and end of a training job").

    A report already written keeps the block's inputs as they were when it trained, in later runs too: Snakemake
    reruns a job whose set of inputs changed. ancient(): a warm-up run again (a recipe change reruns it) must not
    retrain by itself.
    """
    warmup_report = TRAIN / "compile_warmup.json"
    first = wildcards.block == next(iter(BLOCKS))
    wanted = config["train"]["compile_warmup"] and config["train"]["device"] == "cuda"
    if (
        first
        and wanted
        and (warmup_report.exists() or not (DATASET / "train2017").exists())
    ):
        return ancient(str(warmup_report))
    return []


def train_mem_mb(wildcards):
    staged = sum(a["extracted_bytes"] for a in config["archives"].values()) // 10**6
    return config["resources"]["train_mem_mb"] + (
        staged if config["stage"]["enabled"] else 0
    )


def train_runtime(wildcards):
    start, end = BLOCKS[wildcards.block]
    return int(30 + config["resources"]["train_minutes_per_epoch"] * (end - start))


def final_targets():
    last = list(BLOCKS)[-1]
    return [
        *block_outputs(last).values(),
        str(RESULTS / "metrics.csv"),
        str(RESULTS / "plots" / "loss.png"),
        str(RESULTS / "plots" / "map.png"),
        str(RESULTS / "plots" / "summary.txt"),
        str(RESULTS / "report" / "epochs.html"),
        str(RESULTS / "report" / "run.html"),
        str(EVAL / "metrics.json"),
        str(EVAL / "metrics.html"),
        str(EVAL / "per_class.csv"),
        str(EVAL / "per_class.png"),
        *(str(EXPORT / f"model.{fmt}") for fmt in config["export"]["formats"]),
    ]


def report_requested():
    """Whether this snakemake was asked for `--report` (the report is built after this file is read)."""
    return any(arg == "--report" or arg.startswith("--report=") for arg in sys.argv)


# A report before the run has finished would stop on the first missing file, after a warning per output: say
# instead what is missing and how to get it.
if report_requested():
    missing = [target for target in final_targets() if not Path(target).exists()]
    if missing:
        raise WorkflowError(
            f"The report shows the finished run, and {len(missing)} of its files are missing:\n  "
            + "\n  ".join(missing)
            + "\nRun `snakemake --cores all` to the end first (it resumes where it stopped), then ask for the "
            "report again. While training runs, watch it with TensorBoard instead (README, 'Watching a run')."
        )


def dry_run_requested():
    """Whether this snakemake was asked for a dry run (-n, also among other short flags such as -np)."""
    return any(
        arg in ("--dry-run", "--dryrun") or re.fullmatch(r"-[a-zA-Z]*n[a-zA-Z]*", arg)
        for arg in sys.argv[1:]
    )


if dry_run_requested():
    logger.info(needs_summary(config))


onstart:
    # Jobs are about to run. On this machine (not through a cluster executor, whose login node has no GPU), a
    # training or evaluation job that is due stops here if there is no GPU: before the first download.
    if workflow.local_exec and not workflow.touch:
        due = {job.rule.name for job in workflow.dag.needrun_jobs()}
        if problem := gpu_preflight(config, due):
            raise WorkflowError(problem)

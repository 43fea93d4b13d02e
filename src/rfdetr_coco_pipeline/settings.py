"""The workflow's settings: config.yaml, validated once, as one typed and immutable object.

`load_settings` is the one place a config becomes `Settings`: it reads the strings of `--config` as the schema's
types, checks everything against `schemas/config.schema.yaml` (an error names each key and where it was set) and
builds the object. The Snakefile calls it before any job is planned and hands the result to every job through the
environment (`SETTINGS_ENV`), where `job_settings` restores the same object: a job never re-reads or re-merges the
config.

`Settings.recipe` holds what defines the trained weights (config.yaml's recipe keys of `train`): the training rules
take it as a parameter, so changing it reruns training. Everything else says how the run goes (paths, workers,
loggers, retries, the GPU profile table, the speedups): changing it never reruns a finished job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rfdetr_coco_pipeline.common import StageError

SETTINGS_ENV = "RFDETR_COCO_PIPELINE_SETTINGS"  # the validated settings as JSON, set by the Snakefile for its jobs
RUN_STARTED_ENV = "RFDETR_COCO_PIPELINE_RUN_STARTED"  # when the snakemake run began (seconds since the epoch)
# int or float as written: the recipe's values are hashed into the run's id, so 1 must stay 1, not become 1.0
Number = int | float


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Archive(Section):
    name: str
    url: str
    md5: str
    folder: str
    size_bytes: int
    extracted_bytes: int


class Download(Section):
    attempts: int
    backoff_seconds: Number
    max_backoff_seconds: Number
    timeout_seconds: Number
    disk_headroom_gb: Number


class Extract(Section):
    keep_archives: bool


class ExpectedImages(Section):
    train2017: int
    val2017: int


class Verify(Section):
    expected_images: ExpectedImages
    decode_images: bool
    unlisted_images: Literal["error", "warn"]


class Stage(Section):
    enabled: bool
    ramdisk: Path
    subdir: str
    headroom_gb: Number
    remove_after_training: bool


class Recipe(Section):
    """config.yaml's `train` keys that shape the trained weights; in this order in the train rule's parameter."""

    epochs: int
    seed: int
    lr: Number
    lr_encoder: Number
    warmup_epochs: Number
    resolution: int
    grad_accum_steps: int
    multi_scale: bool
    square_resize_div_64: bool
    eval_interval: int
    gpus: int
    lr_scaling: Literal["linear", "none"]
    nodes: int = 1  # optional in config.yaml: a config written before it existed trains on one node

    @property
    def ranks(self) -> int:
        """Training processes, one per GPU: `gpus` on each of `nodes` nodes."""
        return self.gpus * self.nodes

    @property
    def lr_scale(self) -> int:
        """What lr and lr_encoder are multiplied by: the GPU count of all nodes with `lr_scaling: linear`."""
        return self.ranks if self.lr_scaling == "linear" else 1

    def values(self) -> dict[str, Any]:
        """The recipe's values; `nodes` only when above 1, so that a one-node run keeps the id and the training
        rule's parameter it had before `nodes` existed (and resumes after an upgrade)."""
        return self.model_dump(exclude={"nodes"} if self.nodes == 1 else None)

    def as_parameter(self) -> str:
        """The recipe as the training rules' parameter: a change of any value reruns training."""
        return json.dumps(self.values())


class Training(Section):
    """How training runs: config.yaml's `train` keys outside the recipe."""

    epochs_per_block: int
    max_workers: int
    host_threads: int
    loader_niceness: int
    device: Literal["cuda", "cpu"]
    profile: str
    fp8_fallback: Literal["error", "bf16"]
    speedups: Literal["auto", "all", "none"] | tuple[str, ...]
    compile_warmup: bool
    loggers: tuple[Literal["csv", "tensorboard", "mlflow", "wandb"], ...]
    launch: Literal["auto", "lightning", "srun"] = "auto"  # optional in config.yaml, like Recipe.nodes


class Export(Section):
    formats: tuple[Literal["onnx"], ...]


class Cluster(Section):
    local_rules: tuple[str, ...]


class Resources(Section):
    download_mem_mb: int
    extract_mem_mb: int
    verify_mem_mb: int
    train_mem_mb: int
    train_minutes_per_epoch: Number
    compile_warmup_mem_mb: int
    compile_warmup_minutes: Number
    plot_mem_mb: int
    evaluate_mem_mb: int
    evaluate_minutes: Number
    export_mem_mb: int


class GpuProfile(Section):
    """A row of `gpu_profiles`: the training settings for the GPUs it matches."""

    name: str
    match: str | None = None
    auto: bool = True
    min_capability: Number = 0
    min_memory_gb: Number = 0
    batch_size: int
    precision: Literal["bf16", "fp16", "fp8", "fp32"]
    compile: bool
    cuda_graphs: bool
    # Decoder queries per group. None: rfdetr's own (the notebook's 300). Smaller only on the CPU row, whose smoke runs
    # then take a fraction of the time: the decoder's 13 groups of queries are most of a CPU step.
    num_queries: int | None = None


class Paths(Section):
    """Where the workflow keeps its files, shared by the rules and the stages."""

    data: Path
    results: Path

    @property
    def archives(self) -> Path:
        return self.data / "archives"

    @property
    def dataset(self) -> Path:
        return self.data / "coco2017"

    @property
    def train(self) -> Path:
        return self.results / "train"

    @property
    def state(self) -> Path:
        """The training runs' state (in-progress checkpoints, compile caches): never a Snakemake output, so no
        failed job can delete it."""
        return self.train / "state"


class Settings(Section):
    preflight: bool
    data_dir: Path
    results_dir: Path
    archives: tuple[Archive, ...]
    download: Download
    extract: Extract
    verify: Verify
    stage: Stage
    recipe: Recipe
    train: Training
    export: Export
    cluster: Cluster
    resources: Resources
    gpu_profiles: tuple[GpuProfile, ...]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """The settings of a valid config (config.yaml's layout): `train` splits into the recipe and the rest, and
        `archives` keeps its order with each archive's name."""
        train = dict(config["train"])
        recipe = {key: train.pop(key) for key in Recipe.model_fields if key in train}
        archives = [{"name": name, **archive} for name, archive in config["archives"].items()]
        return cls.model_validate({**config, "archives": archives, "recipe": recipe, "train": train})

    @property
    def srun_launch(self) -> bool:
        """Whether SLURM's srun starts the training processes, one task per GPU on every node (`train.launch: srun`,
        or `auto` with `train.nodes` above 1), rather than Lightning starting them on the one node. A single process
        needs neither."""
        launch = self.train.launch
        return self.recipe.ranks > 1 and (launch == "srun" or (launch == "auto" and self.recipe.nodes > 1))

    @property
    def paths(self) -> Paths:
        return Paths(data=self.data_dir, results=self.results_dir)

    def archive(self, name: str) -> Archive:
        return next(archive for archive in self.archives if archive.name == name)


def load_settings(config: Mapping[str, Any], schema: Path, config_file: Path | None = None) -> Settings:
    """The validated settings of `config` (what Snakemake merged from config.yaml, `--configfile` and `--config`).

    Strings of `--config` are first read as the types the schema asks for; then every problem stops with
    `ConfigError`, naming each key and whether its value is `config_file`'s (the workflow's config.yaml) or came
    from the command line."""
    from rfdetr_coco_pipeline.config_check import coerce_to_schema, load_schema, validate_config

    schema_data = load_schema(schema)
    coerced = coerce_to_schema(dict(config), schema_data)
    validate_config(coerced, schema_data, config_file)
    return Settings.from_config(coerced)


def job_settings() -> Settings:
    """The settings the Snakefile validated, as every job receives them."""
    if SETTINGS_ENV not in os.environ:
        raise StageError(f"{SETTINGS_ENV} is not set: this script is run by the workflow (snakemake), not by hand.")
    return Settings.model_validate_json(os.environ[SETTINGS_ENV])


def run_started() -> float | None:
    """When the snakemake run that started this job began (the Snakefile sets it once per run; a cluster job that
    reads the Snakefile again keeps the value it inherits); None outside a run."""
    value = os.environ.get(RUN_STARTED_ENV)
    return float(value) if value else None


def profile_names(profiles: Sequence[GpuProfile]) -> list[str]:
    return [profile.name for profile in profiles]

"""Config validation: every class of invalid value stops the run before any job, naming the key."""

from __future__ import annotations

import copy

import pytest

from pipeline.config_check import config_errors, load_schema
from tests.helpers.workflow import REPO, base_config, jobs_run, run_snakemake, write_config

SCHEMA = load_schema(REPO / "schemas" / "config.schema.yaml")


def test_the_shipped_config_is_valid():
    assert config_errors(base_config(), SCHEMA) == []


def edited(path: str, value) -> dict:
    config = copy.deepcopy(base_config())
    *parents, key = path.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    node[key] = value
    return config


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("train.epochs", "forty", "train.epochs: 'forty' is not of type 'integer'"),
        ("train.epochs", 0, "train.epochs: 0 is less than the minimum of 1"),
        ("train.epochs", -3, "train.epochs: -3 is less than the minimum of 1"),
        ("train.epochs_per_block", 0, "train.epochs_per_block: 0 is less than the minimum of 1"),
        ("train.resolution", 100, "train.resolution: 100 is not a multiple of 32"),
        ("train.lr", -1e-4, "train.lr: -0.0001 is less than or equal to the minimum of 0"),
        ("train.device", "tpu", "train.device: 'tpu' is not one of ['cuda', 'cpu']"),
        ("train.profile", "b200", "train.profile: unknown GPU profile 'b200'"),
        ("train.epoch", 10, "train.epoch: unknown key"),
        ("stage.ramdsk", "/dev/shm", "stage.ramdsk: unknown key"),
        ("download.attempts", 2.5, "download.attempts: 2.5 is not of type 'integer'"),
        ("archives.val2017.md5", "nope", "archives.val2017.md5: 'nope' does not match"),
        ("verify.expected_images.val2017", -1, "verify.expected_images.val2017: -1 is less than the minimum"),
    ],
)
def test_each_class_of_invalid_value_names_the_key(path, value, expected):
    errors = config_errors(edited(path, value), SCHEMA)
    assert any(expected in e for e in errors), errors


def test_a_missing_section_is_named():
    config = base_config()
    del config["stage"]
    assert "(top level): 'stage' is a required property" in config_errors(config, SCHEMA)


def test_an_fp8_row_must_be_the_te_graph_route():
    config = base_config()
    config["gpu_profiles"][0]["precision"] = "fp8"
    assert any("gpu_profiles[0] (rtx-pro-6000): precision fp8" in e for e in config_errors(config, SCHEMA))


def test_snakemake_refuses_an_invalid_config_before_any_job(tmp_path):
    write_config(tmp_path, edited("train.epochs", -1))
    result = run_snakemake(tmp_path, timeout=120)
    assert result.returncode != 0
    assert (
        "Invalid configuration" in result.stdout and "train.epochs: -1 is less than the minimum of 1" in result.stdout
    )
    assert jobs_run(result.stdout) == [] and not (tmp_path / "data").exists() and not (tmp_path / "results").exists()

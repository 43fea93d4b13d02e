"""Config validation: every class of invalid value stops the run before any job, naming the key."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from snakemake.utils import update_config

from rfdetr_coco_pipeline.config_check import coerce_to_schema, config_errors, load_schema
from tests.helpers.workflow import REPO, base_config, dry_run_jobs, jobs_run, run_snakemake, write_config

SCHEMA = load_schema(REPO / "schemas" / "config.schema.yaml")


def test_the_shipped_config_is_valid():
    assert config_errors(base_config(), SCHEMA) == []


def test_a_list_of_speedups_may_start_from_all():
    assert config_errors(edited("train.speedups", ["all", "resize_in_torch"]), SCHEMA) == []


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
        ("archives.val2017.folder", "..", "archives.val2017.folder: '..' does not match"),  # never outside data_dir
        ("archives.val2017.folder", ".", "archives.val2017.folder: '.' does not match"),
        ("verify.expected_images.val2017", -1, "verify.expected_images.val2017: -1 is less than the minimum"),
        ("train.speedups", ["all", "fastest"], "train.speedups: unknown speedup(s) fastest (known: all, "),
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


def typed_leaves(value, schema, path=()):
    """(path, value) of every setting of the shipped config whose schema type is not a string."""
    schema = resolve(schema)
    if isinstance(value, dict):
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key) or schema.get("additionalProperties")
            if isinstance(sub, dict):
                yield from typed_leaves(item, sub, (*path, key))
    elif not isinstance(value, str) and not (isinstance(value, list) and value and isinstance(value[0], dict)):
        yield path, value


def resolve(schema):
    while "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


LEAVES = [(path, value) for path, value in typed_leaves(base_config(), SCHEMA) if len(path) >= 2]


def flow(value) -> str:
    """`value` as a person types it in YAML's flow style: [a, b], true, 20, 0.0001."""
    if isinstance(value, list):
        return "[" + ", ".join(flow(item) for item in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("form", ["json", "yaml"])
def test_both_documented_override_forms_work_for_every_typed_key(form):
    """Each typed setting (numbers, booleans, lists) given back as `--config 'section={"key": value}'` or
    `section={key: value}`, parsed by snakemake's own --config parser, is the setting the shipped config has."""
    from snakemake.cli import parse_config

    assert len(LEAVES) > 40  # every integer, number, boolean and list in config.yaml
    for path, value in LEAVES:
        *parents, key = path
        text = json.dumps(value) if form == "json" else flow(value)
        inner = f'"{key}": {text}' if form == "json" else f"{key}: {text}"
        for parent in reversed(parents[1:]):
            inner = f'"{parent}": {{{inner}}}' if form == "json" else f"{parent}: {{{inner}}}"
        given = parse_config([f"{parents[0]}={{{inner}}}"])
        config = copy.deepcopy(base_config())
        update_config(config, given)
        coerced = coerce_to_schema(config, SCHEMA)
        assert coerced == base_config() and config_errors(coerced, SCHEMA) == [], (path, given)


@pytest.mark.parametrize("override", ['train={"epochs": 30}', "train={epochs: 30, multi_scale: false, lr: 2e-4}"])
def test_snakemake_takes_the_documented_config_overrides(tmp_path, override):
    write_config(tmp_path, base_config())
    result = run_snakemake(tmp_path, "-n", "--config", override, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"train_block\s+3\b", result.stdout)  # 30 epochs in blocks of 10: 3 training jobs


def test_an_invalid_value_is_named_with_where_it_was_set(tmp_path):
    write_config(tmp_path, edited("download.attempts", 0))
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"stage": {"headroom_gb": -1}}))
    command = ["--configfile", str(tmp_path / "config.yaml"), str(tmp_path / "mine.yaml")]
    result = run_snakemake(tmp_path, "-n", *command, "--config", 'train={"epochs": "forty"}', timeout=120)
    assert result.returncode != 0
    assert "download.attempts: 0 is less than the minimum of 1 (set in config.yaml)" in result.stdout
    from_command_line = "(set in the command line: --configfile or --config)"
    assert f"stage.headroom_gb: -1 is less than the minimum of 0 {from_command_line}" in result.stdout
    assert f"train.epochs: 'forty' is not of type 'integer' {from_command_line}" in result.stdout


def test_a_run_starts_by_saying_what_it_needs(tmp_path):
    write_config(tmp_path, base_config())
    result = run_snakemake(tmp_path, "data/preflight/gpus.json", "--config", "preflight=false", timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = result.stdout[result.stdout.index("What this run needs:") :]
    needed = sum(a["extracted_bytes"] for a in base_config()["archives"].values()) + max(
        a["size_bytes"] for a in base_config()["archives"].values()
    )
    assert re.search(r"disk: [\d.]+ GiB more at the peak for the data in data, [\d.]+ [GKMT]?i?B free there", summary)
    assert f"{needed / 2**30:.2f} GiB more" in summary
    assert "RAM disk: " in summary and "GPU: none found here" in summary
    assert "time asked of a scheduler: 12.0 h for 4 training block(s)" in summary  # 4 x (30 + 15 x 10) min
    assert json.loads((tmp_path / "data" / "preflight" / "gpus.json").read_text())["checked"] is False


def test_no_export_formats_leave_out_the_export_stage_and_nothing_else(tmp_path):
    write_config(tmp_path, base_config())
    default = run_snakemake(tmp_path, "-n", timeout=120)
    assert default.returncode == 0, default.stdout[-3000:]
    assert base_config()["export"]["formats"] == ["onnx"]
    assert dry_run_jobs(default.stdout)["export_model"] == 1 and "results/export/model.onnx" in default.stdout
    write_config(tmp_path, edited("export.formats", []))
    without = run_snakemake(tmp_path, "-n", timeout=120)
    assert without.returncode == 0, without.stdout[-3000:]
    assert "export_model" not in without.stdout and "results/export" not in without.stdout
    assert dry_run_jobs(without.stdout) == {
        rule: n for rule, n in dry_run_jobs(default.stdout).items() if rule != "export_model"
    }

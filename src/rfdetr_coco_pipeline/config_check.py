"""Check the workflow's configuration against its JSON schema, with errors that name the key and where its value came
from (the workflow's config.yaml, or the command line).

`snakemake --config 'train={"epochs": 20}'` hands nested values over as strings ('20'); `coerce_to_schema` turns such
a string into the number, boolean or list the schema asks for there, so every documented override works for every
typed key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from rfdetr_coco_pipeline.hooks import speedup_setting_problem

Path_ = tuple[str | int, ...]  # a key's path in the config: ("train", "epochs"), ("gpu_profiles", 0, "name")


def key_name(path: Sequence[str | int]) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else str(p) for p in path]
    return ".".join(parts).replace(".[", "[") or "(top level)"


def _schema_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> Iterator[tuple[Path_, str]]:
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        path = tuple(error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed)):
                yield (*path, key), f"{key_name((*path, key))}: unknown key (allowed here: {', '.join(allowed)})"
        else:
            yield path, f"{key_name(path)}: {error.message}"


def _profile_errors(config: Mapping[str, Any]) -> Iterator[tuple[Path_, str]]:
    profiles = config.get("gpu_profiles") or []
    names = [p.get("name") for p in profiles if isinstance(p, Mapping)]
    for name in {n for n in names if names.count(n) > 1}:
        yield ("gpu_profiles",), f"gpu_profiles: the name {name!r} is used more than once"
    for index, profile in enumerate(profiles):
        if not isinstance(profile, Mapping):
            continue
        if profile.get("precision") == "fp8" and (profile.get("compile") or not profile.get("cuda_graphs")):
            yield (
                ("gpu_profiles", index),
                f"gpu_profiles[{index}] ({profile.get('name')}): precision fp8 is the Transformer Engine graph route; "
                "set compile: false, cuda_graphs: true",
            )
    train = config.get("train")
    if not isinstance(train, Mapping):
        return
    if problem := speedup_setting_problem(train.get("speedups")):
        yield ("train", "speedups"), problem
    pinned = train.get("profile")
    if pinned not in (None, "auto") and pinned not in names:
        yield (
            ("train", "profile"),
            f"train.profile: unknown GPU profile {pinned!r} (known: auto, {', '.join(map(str, names))})",
        )
    if train.get("nodes", 1) > 1 and train.get("launch", "auto") == "lightning":
        yield (
            ("train", "launch"),
            f"train.launch: lightning starts the processes of one node only, and train.nodes is {train['nodes']}; "
            "set train.launch: srun (or auto), or train.nodes: 1",
        )
    if train.get("device") == "cpu" and pinned == "auto" and "cpu" not in names:
        yield ("train", "profile"), "train.profile: device cpu with profile auto needs a gpu_profiles row named 'cpu'"


def located_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[tuple[Path_, str]]:
    """Every problem in `config` with the path of its key; the checks beyond the schema run once it holds."""
    errors = list(_schema_errors(config, schema))
    if not errors:
        errors.extend(_profile_errors(config))
    return errors


def config_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every problem in `config`, one line each, naming the key ('train.epochs: ...')."""
    return [text for _, text in located_errors(config, schema)]


def load_schema(path: str | Path) -> dict[str, Any]:
    with open(path) as handle:
        return yaml.safe_load(handle)


# ------------------------------------------------------------- --config strings ----


def _subschema_validator(schema: Mapping[str, Any], root: Mapping[str, Any]) -> jsonschema.Validator:
    return jsonschema.Draft202012Validator({"$defs": root.get("$defs", {}), **schema})


def _parsed(text: str) -> Iterator[Any]:
    """What a string from the command line may stand for, as snakemake parses top-level --config values."""
    for parse in (json.loads, yaml.safe_load):
        try:
            yield parse(text)
        except (ValueError, yaml.YAMLError):
            continue
    try:
        yield float(text)  # YAML 1.1 reads 2e-4 as text; it is a number
    except ValueError:
        pass


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def coerce_to_schema(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """`value` with every string the schema does not accept at its place replaced by the first parse of it (JSON,
    YAML, a float) that the schema accepts there; everything else unchanged. Returns the new value."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    if isinstance(value, str) and not _subschema_validator(schema, root).is_valid(value):
        for candidate in _parsed(value):
            if not isinstance(candidate, str) and _subschema_validator(schema, root).is_valid(
                coerce_to_schema(candidate, schema, root)
            ):
                return coerce_to_schema(candidate, schema, root)
        return value
    if isinstance(value, Mapping):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {
            key: coerce_to_schema(item, properties[key] if key in properties else extra, root)
            if key in properties or isinstance(extra, Mapping)
            else item
            for key, item in value.items()
        }
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [coerce_to_schema(item, schema["items"], root) for item in value]
    return value


# ------------------------------------------------------------- where a value came from ----


_UNSET = object()


def _value_at(mapping: Any, path: Path_) -> Any:
    node = mapping
    for part in path:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return _UNSET
    return node


def source_of(path: Path_, config: Mapping[str, Any], file_values: Mapping[str, Any] | None, file_name: str) -> str:
    """Where the value at `path` (or, for a missing key, its nearest parent) was set: the workflow's config file
    when it holds that very value there, else the command line (a `--configfile` or `--config`)."""
    while path and _value_at(config, path) is _UNSET:
        path = path[:-1]
    if file_values is not None and _value_at(file_values, path) == _value_at(config, path):
        return file_name
    return "the command line: --configfile or --config"


class ConfigError(ValueError):
    pass


def validate_config(config: Mapping[str, Any], schema: Mapping[str, Any], config_file: Path | None = None) -> None:
    """Raise ConfigError listing every invalid key of `config` and where its value was set (`source_of`);
    `config_file` is the workflow's own config.yaml, when there is one."""
    errors = located_errors(config, schema)
    if not errors:
        return
    file_values = None
    if config_file is not None and config_file.is_file():
        file_values = yaml.safe_load(config_file.read_text()) or {}
    lines = [f"  - {text} (set in {source_of(path, config, file_values, str(config_file))})" for path, text in errors]
    raise ConfigError(
        f"Invalid configuration ({len(errors)} problem(s)); fix each where it was set:\n" + "\n".join(lines)
    )

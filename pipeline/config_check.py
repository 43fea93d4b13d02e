"""Validate the workflow configuration against its JSON schema, with errors that name the key."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from rfdetr_extensions import NAMES as SPEEDUP_NAMES


def _key(path: Any) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else str(p) for p in path]
    return ".".join(parts).replace(".[", "[") or "(top level)"


def _schema_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> Iterator[str]:
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        where = _key(error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(allowed))
            for key in unknown:
                name = f"{where}.{key}" if error.absolute_path else key
                yield f"{name}: unknown key (allowed here: {', '.join(allowed)})"
        elif error.validator == "required":
            yield f"{where}: {error.message}"
        else:
            yield f"{where}: {error.message}"


def _profile_errors(config: Mapping[str, Any]) -> Iterator[str]:
    profiles = config.get("gpu_profiles") or []
    names = [p.get("name") for p in profiles if isinstance(p, Mapping)]
    for name in {n for n in names if names.count(n) > 1}:
        yield f"gpu_profiles: the name {name!r} is used more than once"
    for index, profile in enumerate(profiles):
        if not isinstance(profile, Mapping):
            continue
        key = f"gpu_profiles[{index}] ({profile.get('name')})"
        if profile.get("precision") == "fp8" and (profile.get("compile") or not profile.get("cuda_graphs")):
            yield f"{key}: precision fp8 is the Transformer Engine graph route; set compile: false, cuda_graphs: true"
    train = config.get("train")
    if not isinstance(train, Mapping):
        return
    speedups = train.get("speedups")
    if isinstance(speedups, list):
        unknown = [name for name in speedups if name not in SPEEDUP_NAMES]
        if unknown:
            yield f"train.speedups: unknown speedup(s) {', '.join(unknown)} (known: {', '.join(SPEEDUP_NAMES)})"
    pinned = train.get("profile")
    if pinned not in (None, "auto") and pinned not in names:
        yield f"train.profile: unknown GPU profile {pinned!r} (known: auto, {', '.join(map(str, names))})"
    if train.get("device") == "cpu" and pinned == "auto" and "cpu" not in names:
        yield "train.profile: device cpu with profile auto needs a gpu_profiles row named 'cpu'"


def config_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every problem in `config`, one line each, naming the key ('train.epochs: ...')."""
    errors = list(_schema_errors(config, schema))
    if not errors:
        errors.extend(_profile_errors(config))
    return errors


def load_schema(path: str | Path) -> dict[str, Any]:
    with open(path) as handle:
        return yaml.safe_load(handle)


class ConfigError(ValueError):
    pass


def validate_config(config: Mapping[str, Any], schema_path: str | Path) -> None:
    """Raise ConfigError listing every invalid key; called by the Snakefile before any job is planned."""
    errors = config_errors(config, load_schema(schema_path))
    if errors:
        lines = "\n".join(f"  - {e}" for e in errors)
        raise ConfigError(f"Invalid configuration ({len(errors)} problem(s)); fix config.yaml:\n{lines}")

"""The training recipe: every setting that shapes the trained weights, and the id that names a run by them.

`RECIPE_KEYS` is the one list of config.yaml's `train` settings that belong to the recipe. `rules/common.smk` passes
them to the train rule as a parameter (so a change reruns training), and `recipe_of` puts them, with the GPU
profile's batch size and precision and the rfdetr version, into the recipe that `recipe_id` hashes: checkpoints
resume only under an equal recipe. Shown by `tests/test_train.py`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

RECIPE_KEYS = (  # in this order: the train rule's parameter is their JSON, and a new order would rerun training
    "epochs",
    "seed",
    "lr",
    "lr_encoder",
    "warmup_epochs",
    "resolution",
    "grad_accum_steps",
    "multi_scale",
    "square_resize_div_64",
    "eval_interval",
    "gpus",
    "lr_scaling",
)
SCALED_BY_GPUS = ("lr", "lr_encoder")  # multiplied by the GPU count when lr_scaling is linear

INIT_NOTE = (
    "Initialisation: pretrain_weights=None, so no released detector checkpoint is loaded. For Nano (patch 16, "
    "24x24 position grid) rfdetr 1.11.2 also loads NO DINOv2 backbone weights: the whole model, backbone "
    "included, starts from random initialisation, although the reference notebook says the backbone keeps "
    "its DINOv2 weights. Expect lower mAP than a DINOv2-initialised run."
)


def recipe_of(train: Mapping[str, Any], profile: Mapping[str, Any], rfdetr: str) -> dict[str, Any]:
    """Every setting that shapes the trained weights; `lr_scaling` is folded into the learning rates."""
    lr_scale = train["gpus"] if train.get("lr_scaling", "linear") == "linear" else 1
    return {
        "model": "RFDETRNano",
        "pretrain_weights": None,
        "rfdetr": rfdetr,
        **{key: train[key] for key in RECIPE_KEYS if key not in (*SCALED_BY_GPUS, "lr_scaling")},
        **{key: train[key] * lr_scale for key in SCALED_BY_GPUS},
        "batch_size": profile["batch_size"],
        "precision": profile["precision"],
    }


def recipe_id(recipe: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def recipe_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))

"""The recipe a run is trained with, and the id that names the run by it.

`run_recipe` joins the configured recipe (`Settings.recipe`) with what the route adds to it: the GPU profile's batch
size, precision and model settings, the rfdetr version, the learning rates scaled for the GPU count. `recipe_id`
hashes it: a run's state folder is named by it, and checkpoints resume only under an equal recipe.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from rfdetr_coco_pipeline.settings import GpuProfile, Recipe

SCALED_BY_GPUS = ("lr", "lr_encoder")  # multiplied by the GPU count of all nodes when lr_scaling is linear

INIT_NOTE = (
    "Initialisation: pretrain_weights=None, so no released detector checkpoint is loaded. For Nano (patch 16, "
    "24x24 position grid) rfdetr loads NO DINOv2 backbone weights either: the whole model, backbone included, "
    "starts from random initialisation, although the reference notebook says the backbone keeps its DINOv2 "
    "weights. Expect lower mAP than a DINOv2-initialised run."
)


def run_recipe(recipe: Recipe, profile: GpuProfile, rfdetr: str) -> dict[str, Any]:
    """Every setting that shapes the trained weights; `lr_scaling` is folded into the learning rates."""
    values = recipe.values()
    return {
        "model": "RFDETRNano",
        "pretrain_weights": None,
        "rfdetr": rfdetr,
        **{key: value for key, value in values.items() if key not in (*SCALED_BY_GPUS, "lr_scaling")},
        **{key: values[key] * recipe.lr_scale for key in SCALED_BY_GPUS},
        "batch_size": profile.batch_size,
        "precision": profile.precision,
        **model_settings(profile),
    }


def model_settings(profile: GpuProfile) -> dict[str, Any]:
    """The profile's settings of rfdetr's model, for `RFDETRNano(...)` and the recipe: only those a row sets, so that
    the rows that keep rfdetr's model keep the recipe ids of runs made before the settings existed."""
    return {"num_queries": profile.num_queries} if profile.num_queries is not None else {}


def nodes_of(recipe: Mapping[str, Any]) -> int:
    """The node count of a run recipe: `nodes` is in it only when above 1 (`Recipe.values`)."""
    return recipe.get("nodes", 1)


def recipe_id(recipe: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def recipe_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))

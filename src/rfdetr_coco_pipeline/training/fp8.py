"""The Transformer Engine FP8 route: whether it can run here, and the batch shapes its FP8 layers take.

Transformer Engine's FP8 GEMMs take only inputs whose rows (the product of every dimension but the last) are
multiples of 8. Every rule about that lives here: the batch multiple it implies for RF-DETR Nano, the validation
batch a set leaves off it, and what the route needs from the machine and the recipe.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

from rfdetr_coco_pipeline.settings import Recipe
from rfdetr_coco_pipeline.training.device import Device

MIN_CAPABILITY = (8, 9)  # Ada, Hopper, Blackwell
ROWS = 8
# Run in the checkout, in its environment. `--no-build-isolation`: transformer_engine_torch (a source distribution)
# builds against the installed torch and, from that torch's CUDA major version, requires transformer_engine_cu12 or
# transformer_engine_cu13. Without build isolation the build takes its tools from the environment: setuptools (the
# backend), wheel (its setup.py imports it), ninja (parallel compilation). docs/fp8.md shows this command.
INSTALL = "pip install setuptools wheel ninja && pip install --no-build-isolation -e '.[fp8]'"


def batch_multiple(resolution: int, patch: int = 16, windows: int = 2, queries: int = 300) -> int:
    """The smallest batch whose multiples give every Transformer Engine layer of RF-DETR Nano rows in multiples of 8
    at `resolution`. Per image the backbone's linear layers see windows² × (patches per window + 1 class token) rows
    (580 at 384 px), the encoder's the patches (576), the decoder's the queries (300): 580 and 300 carry only 4 of
    the 8, so batches must be even. Every batch counts, the last of an epoch's validation too."""
    side = resolution // patch
    rows_per_image = (windows**2 * ((side // windows) ** 2 + 1), side**2, queries)
    return math.lcm(*(ROWS // math.gcd(ROWS, rows) for rows in rows_per_image))


def route_batch_multiple(precision: str, resolution: int) -> int:
    """What every training and validation batch must be a multiple of on a route of `precision` (1: no rule)."""
    return batch_multiple(resolution) if precision == "fp8" else 1


def last_batch_off_the_rule(val_images: int, batch: int, ranks: int = 1, multiple: int = 1) -> int:
    """The image count of each rank's last validation batch when it is no multiple of `multiple`, else 0. rfdetr's
    validation loader keeps a last, smaller batch (no drop_last), and when a rank's share is itself no multiple of
    the rule (an odd count such as 4,999) no batch size makes that last batch keep it."""
    share = -(-val_images // ranks)
    last = share % batch or batch
    return last if last % multiple else 0


def transformer_engine_problem() -> str | None:
    """Why Transformer Engine cannot be used here, or None when `transformer_engine.pytorch` imports."""
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as error:  # ImportError, or an ABI mismatch surfacing as OSError/RuntimeError
        return (
            f"Transformer Engine does not import ({type(error).__name__}: {error}); install it in the checkout with "
            f"{INSTALL} (it builds against your torch and CUDA; docs/fp8.md)"
        )
    return None


def route_problems(
    device: Device, recipe: Recipe, te_problem: Callable[[], str | None] = transformer_engine_problem
) -> list[str]:
    """Every reason the Transformer Engine FP8 graph route cannot run; empty when it can."""
    problems = []
    if device.kind != "cuda":
        problems.append("the FP8 route needs a CUDA GPU")
    elif device.capability < MIN_CAPABILITY:
        major, minor = device.capability
        problems.append(
            f"{device.name} has compute capability {major}.{minor}; FP8 needs 8.9 or newer (Ada, Hopper, Blackwell)"
        )
    if recipe.grad_accum_steps != 1:
        problems.append("set train.grad_accum_steps: 1 (FP8 graphs capture one optimizer step)")
    if recipe.multi_scale:
        problems.append("set train.multi_scale: false (FP8 graphs need one fixed input shape)")
    if not recipe.square_resize_div_64:
        problems.append("set train.square_resize_div_64: true (FP8 graphs need one fixed input shape)")
    if recipe.ranks != 1:
        problems.append("set train.gpus: 1 and train.nodes: 1 (the FP8 graph route is single-GPU only)")
    if te := te_problem():
        problems.append(te)
    return problems

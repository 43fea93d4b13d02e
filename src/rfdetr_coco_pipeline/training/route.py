"""How this machine trains: the device, the GPU profile and the speedups, settled together in one place.

`settle_route` takes the steps in their order, each once: the device (and enough GPUs for `train.gpus`); its GPU
profile; the FP8 route's checks (an error naming the fixes, or compiled bf16 with `train.fp8_fallback: bf16`); the
speedups for the installed rfdetr and this device; and last CUDA graph replay, which is kept only where it can run
and pays for itself. The train stage and the compile warm-up both call it, so the warm-up compiles the graphs the
training will look up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.hooks import Selection, select_speedups
from rfdetr_coco_pipeline.settings import GpuProfile, Recipe, Settings
from rfdetr_coco_pipeline.training import fp8
from rfdetr_coco_pipeline.training.device import Device, check_gpu_count, detect_device
from rfdetr_coco_pipeline.training.profiles import bf16_fallback, resolve_profile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    device: Device
    profile: GpuProfile
    reason: str  # why this profile, and what was changed in it
    speedups: Selection
    batch_multiple: int  # what every batch must be a multiple of (the FP8 layers' rule; 1: none)

    def log(self) -> None:
        log.info("Device: %s", self.device.describe())
        log.info("GPU profile: %s (%s): %s", self.profile.name, self.reason, json.dumps(self.profile.model_dump()))
        for line in self.speedups.report():
            log.info("%s", line)


def cuda_graphs_off_reason(profile: GpuProfile, recipe: Recipe, static_graphs: bool) -> str | None:
    """Why a compiled profile's `cuda_graphs` must be off for `recipe`, or None. Inductor's CUDA graphs replay one
    GPU's step without gradient accumulation only (rfdetr stops otherwise), and pay for their warm-up only for one
    fixed input shape. Without the `static_cuda_graphs` speedup rfdetr compiles for dynamic shapes when they are on,
    which the reference notebook does only at batches up to 16."""
    fixed_shape = not recipe.multi_scale and recipe.square_resize_div_64
    if not (recipe.ranks == 1 and recipe.grad_accum_steps == 1 and fixed_shape):
        return (
            "CUDA graph replay needs train.gpus: 1, train.nodes: 1, train.grad_accum_steps: 1, "
            "train.multi_scale: false and train.square_resize_div_64: true"
        )
    if profile.compile and not static_graphs and profile.batch_size > 16:
        return (
            "the static_cuda_graphs speedup is not applied, and rfdetr's own CUDA graphs (compiled for dynamic "
            "shapes) are the notebook's choice only at batch_size <= 16"
        )
    return None


def settle_route(
    settings: Settings,
    rfdetr_version: str,
    device: Device | None = None,
    te_problem: Callable[[], str | None] = fp8.transformer_engine_problem,
) -> Route:
    """The route the train stage takes on `device` (None: the one found here), logged."""
    recipe = settings.recipe
    device = device or detect_device(settings.train.device)
    check_gpu_count(device, recipe.gpus)
    profile, reason = resolve_profile(settings.gpu_profiles, device, settings.train.profile)
    if profile.precision == "fp8" and (problems := fp8.route_problems(device, recipe, te_problem)):
        listed = "; ".join(problems)
        if settings.train.fp8_fallback != "bf16":
            raise StageError(
                f"GPU profile {profile.name!r} asks for the FP8 route, which cannot run here: {listed}. Fix that, "
                "pin another profile (train.profile), or set train.fp8_fallback: bf16 to train compiled bf16."
            )
        profile, reason = (
            bf16_fallback(profile),
            f"{reason}; FP8 route unavailable ({listed}), so train.fp8_fallback: bf16 applies",
        )
    speedups = select_speedups(settings.train.speedups, rfdetr_version, device_kind=device.kind)
    if profile.precision != "fp8" and profile.cuda_graphs:
        static_graphs = "static_cuda_graphs" in speedups.names()
        if why := cuda_graphs_off_reason(profile, recipe, static_graphs):
            profile, reason = profile.model_copy(update={"cuda_graphs": False}), f"{reason}; cuda_graphs off: {why}"
    route = Route(device, profile, reason, speedups, fp8.route_batch_multiple(profile.precision, recipe.resolution))
    route.log()
    return route

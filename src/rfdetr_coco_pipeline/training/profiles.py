"""Pick the GPU profile (config.yaml: gpu_profiles) for the device found at run time.

Resolved inside the training job, on the machine that has the GPU (a login node that plans the workflow has none).
Matching order: a profile pinned by name; the first automatic row whose `match` pattern is found in the device name;
the first row without a pattern whose minimum compute capability and memory the device meets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.settings import GpuProfile
from rfdetr_coco_pipeline.training.device import Device


def resolve_profile(profiles: Sequence[GpuProfile], device: Device, pinned: str = "auto") -> tuple[GpuProfile, str]:
    """(profile, the reason it was chosen) for `device`; StageError when nothing fits."""
    by_name = {profile.name: profile for profile in profiles}
    if pinned != "auto":
        if pinned not in by_name:
            raise StageError(f"train.profile: unknown GPU profile {pinned!r} (known: {', '.join(by_name)})")
        return by_name[pinned], f"pinned by train.profile: {pinned}"
    if device.kind == "cpu":
        if "cpu" not in by_name:
            raise StageError("train.device is cpu but gpu_profiles has no row named 'cpu'")
        return by_name["cpu"], "train.device is cpu"
    automatic = [profile for profile in profiles if profile.auto and profile.name != "cpu"]
    for profile in automatic:
        if profile.match and re.search(profile.match, device.name, flags=re.IGNORECASE):
            return profile, f"the GPU name {device.name!r} matches {profile.match!r}"
    capability = device.capability[0] + device.capability[1] / 10
    for profile in automatic:
        if not profile.match and capability >= profile.min_capability and device.memory_gb >= profile.min_memory_gb:
            return profile, (
                f"no row names {device.name!r}; compute capability {capability:.1f} and {device.memory_gb:.0f} GB "
                f"meet {profile.name!r} (>= {profile.min_capability}, >= {profile.min_memory_gb} GB)"
            )
    raise StageError(
        f"No GPU profile fits {device.describe()}. Add a row to gpu_profiles in config.yaml, "
        "or pin one with train.profile."
    )


def bf16_fallback(profile: GpuProfile) -> GpuProfile:
    """The compiled-bf16 settings used in place of an FP8 profile that cannot run (train.fp8_fallback: bf16)."""
    return profile.model_copy(
        update={
            "name": f"{profile.name}-bf16-fallback",
            "precision": "bf16",
            "compile": True,
            "cuda_graphs": profile.batch_size <= 16,
        }
    )

"""Pick the training settings for the GPU found at run time (config.yaml: gpu_profiles).

Resolved inside the training job, on the machine that has the GPU (a login node that plans the
workflow has none). Matching order: a profile pinned by name; the first automatic row whose `match`
pattern is found in the device name; the first row without a pattern whose minimum compute capability
and memory the device meets. The FP8 route is checked before training (`settle_profile`), and its validation
batches keep Transformer Engine's shape rule (`fp8_batch_multiple`) or run without FP8. Shown by
`tests/test_gpu_profiles.py`, `tests/test_train.py` and, on a GPU, `tests/test_gpu.py`.
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.common import StageError

FP8_MIN_CAPABILITY = (8, 9)
FP8_ROWS = 8  # Transformer Engine's FP8 GEMMs: every input's rows (the product of all dimensions but the last) % 8 == 0
# Run in the checkout, in its environment. `--no-build-isolation`: transformer_engine_torch (a source distribution)
# builds against the installed torch and, from that torch's CUDA major version, requires transformer_engine_cu12 or
# transformer_engine_cu13. Without build isolation the build takes its tools from the environment: setuptools (the
# backend), wheel (TE's setup.py imports it), ninja (parallel compilation). README.md's
# "The FP8 route" and its fault table show this command (`tests/test_readme.py` checks it).
FP8_INSTALL = "pip install setuptools wheel ninja && pip install --no-build-isolation -e '.[fp8]'"


@dataclass(frozen=True)
class Device:
    """What the training job runs on: a CUDA GPU (name, compute capability, memory) or the CPU."""

    kind: str  # "cuda" or "cpu"
    name: str
    capability: tuple[int, int] = (0, 0)
    memory_gb: float = 0.0
    count: int = 0

    def describe(self) -> str:
        if self.kind == "cpu":
            return "CPU"
        major, minor = self.capability
        return f"{self.count} x {self.name} (compute capability {major}.{minor}, {self.memory_gb:.0f} GB)"


def detect_device(requested: str) -> Device:
    """The device to train on; StageError when a GPU is requested but none is visible."""
    if requested == "cpu":
        return Device("cpu", "cpu")
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise StageError(
            "No CUDA GPU is visible to this job (torch.cuda.is_available() is False). Run on a machine with an "
            "NVIDIA GPU and a CUDA build of torch, check CUDA_VISIBLE_DEVICES and nvidia-smi, or, for a slow "
            "smoke run on the CPU, set train.device: cpu in config.yaml."
        )
    props = torch.cuda.get_device_properties(0)
    return Device(
        "cuda",
        props.name,
        (props.major, props.minor),
        props.total_memory / 1e9,
        torch.cuda.device_count(),
    )


def check_gpu_count(device: Device, gpus: int) -> None:
    """StageError when `train.gpus` asks for more GPUs than this job sees. Without it Lightning stops only once the
    model is built, with "You requested gpu: [0, 1] But your machine only has: [0]", which names neither the setting
    nor the cluster request. The CPU runs `gpus` DDP processes whatever its cores. Shown by
    `tests/test_gpu_profiles.py::test_more_gpus_than_the_job_sees_stop_with_the_setting_to_change`."""
    if device.kind == "cuda" and gpus > device.count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "not set")
        raise StageError(
            f"train.gpus is {gpus}, but this job sees {device.count} GPU(s) ({device.name}; CUDA_VISIBLE_DEVICES: "
            f"{visible}). Set train.gpus to at most {device.count} in config.yaml, or run where {gpus} GPUs of one "
            "node are visible (on SLURM the profile requests train.gpus GPUs for each training job)."
        )


def resolve_profile(
    profiles: Sequence[Mapping[str, Any]], device: Device, pinned: str = "auto"
) -> tuple[dict[str, Any], str]:
    """Return (profile, reason) for `device`; StageError when nothing fits."""
    by_name = {p["name"]: dict(p) for p in profiles}
    if pinned != "auto":
        if pinned not in by_name:
            raise StageError(f"train.profile: unknown GPU profile {pinned!r} (known: {', '.join(by_name)})")
        return by_name[pinned], f"pinned by train.profile: {pinned}"
    if device.kind == "cpu":
        if "cpu" not in by_name:
            raise StageError("train.device is cpu but gpu_profiles has no row named 'cpu'")
        return by_name["cpu"], "train.device is cpu"
    automatic = [dict(p) for p in profiles if p.get("auto", True) and p["name"] != "cpu"]
    for profile in automatic:
        pattern = profile.get("match")
        if pattern and re.search(pattern, device.name, flags=re.IGNORECASE):
            return profile, f"the GPU name {device.name!r} matches {pattern!r}"
    capability = device.capability[0] + device.capability[1] / 10
    for profile in automatic:
        if profile.get("match"):
            continue
        if capability >= profile.get("min_capability", 0) and device.memory_gb >= profile.get("min_memory_gb", 0):
            return profile, (
                f"no row names {device.name!r}; compute capability {capability:.1f} and "
                f"{device.memory_gb:.0f} GB meet {profile['name']!r} (>= {profile.get('min_capability', 0)}, "
                f">= {profile.get('min_memory_gb', 0)} GB)"
            )
    raise StageError(
        f"No GPU profile fits {device.describe()}. Add a row to gpu_profiles in config.yaml, "
        "or pin one with train.profile."
    )


def transformer_engine_problem() -> str | None:
    """Why Transformer Engine cannot be used here, or None when `transformer_engine.pytorch` imports."""
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as error:  # ImportError, or an ABI mismatch surfacing as OSError/RuntimeError
        return (
            f"Transformer Engine does not import ({type(error).__name__}: {error}); install it in the checkout with "
            f"{FP8_INSTALL} (it builds against your torch and CUDA; README.md: The FP8 route)"
        )
    return None


def fp8_batch_multiple(resolution: int, patch: int = 16, windows: int = 2, queries: int = 300) -> int:
    """The smallest batch size whose multiples give every Transformer Engine layer of RF-DETR Nano rows in multiples
    of 8 (`FP8_ROWS`), at `resolution`. Per image, the backbone's linear layers see windows² × (patches per window +
    1 class token) rows (4 × 145 = 580 at 384 px), the encoder's the patches (576), the decoder's the queries (300):
    580 and 300 carry only 4 of the 8, so batches must be even. Every batch counts, the last of an epoch's validation
    too: a validation batch of 125 (COCO's 5,000 images in 40 batches) would stop the route at its first validation;
    a last batch no batch size can make even runs without FP8 (`rfdetr_extensions.fp8_validation`).
    Shown by `tests/test_train.py::test_the_fp8_routes_validation_batches_all_have_rows_in_multiples_of_8`."""
    side = resolution // patch
    rows_per_image = (windows**2 * ((side // windows) ** 2 + 1), side**2, queries)
    return math.lcm(*(FP8_ROWS // math.gcd(FP8_ROWS, rows) for rows in rows_per_image))


def batch_multiple(profile: Mapping[str, Any], resolution: int) -> int:
    """What every training and validation batch must be a multiple of on this profile's route (1: no rule)."""
    return fp8_batch_multiple(resolution) if profile["precision"] == "fp8" else 1


def fp8_route_problems(
    device: Device,
    train: Mapping[str, Any],
    te_problem: Callable[[], str | None] = transformer_engine_problem,
) -> list[str]:
    """Every reason the Transformer Engine FP8 graph route cannot run; empty when it can. A validation set of any
    size can: a batch its size leaves off the shape rule runs without FP8 (`rfdetr_extensions.fp8_validation`)."""
    problems = []
    if device.kind != "cuda":
        problems.append("the FP8 route needs a CUDA GPU")
    elif device.capability < FP8_MIN_CAPABILITY:
        major, minor = device.capability
        problems.append(
            f"{device.name} has compute capability {major}.{minor}; FP8 needs 8.9 or newer (Ada, Hopper, Blackwell)"
        )
    if train.get("grad_accum_steps") != 1:
        problems.append("set train.grad_accum_steps: 1 (FP8 graphs capture one optimizer step)")
    if train.get("multi_scale"):
        problems.append("set train.multi_scale: false (FP8 graphs need one fixed input shape)")
    if not train.get("square_resize_div_64"):
        problems.append("set train.square_resize_div_64: true (FP8 graphs need one fixed input shape)")
    if train.get("gpus", 1) != 1:
        problems.append("set train.gpus: 1 (the FP8 graph route is single-GPU only)")
    te = te_problem()
    if te:
        problems.append(te)
    return problems


def bf16_fallback(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The compiled-bf16 settings used in place of an FP8 profile that cannot run."""
    batch = profile["batch_size"]
    return {
        **profile,
        "name": f"{profile['name']}-bf16-fallback",
        "precision": "bf16",
        "compile": True,
        "cuda_graphs": batch <= 16,
    }


def settle_profile(
    profile: dict[str, Any],
    reason: str,
    device: Device,
    train: Mapping[str, Any],
    te_problem: Callable[[], str | None] = transformer_engine_problem,
    static_graphs: bool = True,
) -> tuple[dict[str, Any], str]:
    """Check the FP8 route before training starts: error, or fall back to compiled bf16 if configured.

    Inductor's CUDA graphs run on one GPU without gradient accumulation only (rfdetr stops otherwise), and are worth
    their warm-up only for one fixed input shape: off for other runs. `static_graphs` says whether the
    `static_cuda_graphs` speedup is applied; without it rfdetr compiles for dynamic shapes when `cuda_graphs` is on,
    which the reference notebook does only at batches up to 16, so larger batches leave the graphs off.
    """
    if profile["precision"] != "fp8":
        fixed_shape = not train.get("multi_scale") and train.get("square_resize_div_64", True)
        single = train.get("gpus", 1) == 1 and train.get("grad_accum_steps", 1) == 1
        if profile["cuda_graphs"] and not (single and fixed_shape):
            profile = {**profile, "cuda_graphs": False}
            reason += (
                "; cuda_graphs off: CUDA graph replay needs train.gpus: 1, train.grad_accum_steps: 1, "
                "train.multi_scale: false and train.square_resize_div_64: true"
            )
        elif profile["cuda_graphs"] and profile["compile"] and not static_graphs and profile["batch_size"] > 16:
            profile = {**profile, "cuda_graphs": False}
            reason += (
                "; cuda_graphs off: the static_cuda_graphs speedup is not applied, and rfdetr's own CUDA graphs "
                "(compiled for dynamic shapes) are the notebook's choice only at batch_size <= 16"
            )
        return profile, reason
    problems = fp8_route_problems(device, train, te_problem)
    if not problems:
        return profile, reason
    listed = "; ".join(problems)
    if train.get("fp8_fallback") == "bf16":
        fallback = bf16_fallback(profile)
        return fallback, f"{reason}; FP8 route unavailable ({listed}), so train.fp8_fallback: bf16 applies"
    raise StageError(
        f"GPU profile {profile['name']!r} asks for the FP8 route, which cannot run here: {listed}. "
        "Fix that, pin another profile (train.profile), or set train.fp8_fallback: bf16 to train compiled bf16."
    )

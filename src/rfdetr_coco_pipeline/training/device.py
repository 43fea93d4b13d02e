"""The device a job runs on: a CUDA GPU (name, compute capability, memory, count) or the CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rfdetr_coco_pipeline.common import StageError


@dataclass(frozen=True)
class Device:
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
    return Device("cuda", props.name, (props.major, props.minor), props.total_memory / 1e9, torch.cuda.device_count())


def check_gpu_count(device: Device, gpus: int) -> None:
    """StageError when `train.gpus` asks for more GPUs than this job sees, naming the setting and the request:
    Lightning's own error comes only once the model is built and names neither. The CPU runs `gpus` DDP processes
    whatever its cores."""
    if device.kind == "cuda" and gpus > device.count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "not set")
        raise StageError(
            f"train.gpus is {gpus}, but this job sees {device.count} GPU(s) ({device.name}; CUDA_VISIBLE_DEVICES: "
            f"{visible}). Set train.gpus to at most {device.count} in config.yaml, or run where {gpus} GPUs of one "
            "node are visible (on SLURM the profile requests train.gpus GPUs for each training job)."
        )

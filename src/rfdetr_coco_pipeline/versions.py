"""The software a job runs with, for run.json and the report: torch, CUDA, cuDNN, the NVIDIA driver, rfdetr,
snakemake, and Transformer Engine when it is installed."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def nvidia_smi_query(fields: str) -> list[str]:
    """nvidia-smi's answer to `--query-gpu=fields`, a line per GPU; empty where there is no NVIDIA driver. Asked
    without importing torch, which takes seconds."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in result.stdout.splitlines() if line.strip()] if result.returncode == 0 else []


def nvidia_driver() -> str | None:
    """The driver version nvidia-smi reports, or None where there is no NVIDIA driver."""
    return next(iter(nvidia_smi_query("driver_version")), None)


def software_versions() -> dict[str, str | None]:
    """The software a training job runs with, for run.json and the report. A cuDNN that torch refuses is recorded
    as such: with Transformer Engine imported, the process may hold the cuDNN its core library found (a CUDA
    toolkit's) rather than torch's, and torch's version check then raises where training itself runs."""
    import torch

    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError as error:  # the cuDNN loaded is not torch's: record it rather than stop a finished run
        cudnn = f"unusable: {error}"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn else None,
        "nvidia_driver": nvidia_driver(),
        "rfdetr": package_version("rfdetr"),
        "snakemake": package_version("snakemake"),
        "pytorch_lightning": package_version("pytorch-lightning"),
        "transformer_engine": package_version("transformer-engine") or package_version("transformer_engine"),
    }

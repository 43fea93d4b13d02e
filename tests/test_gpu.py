"""On a CUDA GPU (run there with `pytest -m gpu`): the train rule picks its profile from the GPU it finds."""

from __future__ import annotations

import json

import pytest
import torch

from tests.workflow import run_snakemake, tiny_config, write_config

pytestmark = pytest.mark.gpu  # left out by default (pyproject addopts); `pytest -m gpu` on a GPU machine


def gpu_config(workdir, server, archives, **train):
    config = tiny_config(workdir, server.url, archives, **{"device": "cuda", "profile": "auto", **train})
    for row in config["gpu_profiles"]:  # keep the automatic match, skip the minutes of compile warm-up
        row["compile"] = False
    return config


def test_the_train_rule_detects_the_gpu_profile_and_trains_two_blocks(workdir, server, archives):
    write_config(workdir, gpu_config(workdir, server, archives, epochs=2, epochs_per_block=1))
    result = run_snakemake(workdir)
    assert result.returncode == 0, result.stdout[-5000:]
    name = torch.cuda.get_device_name(0)
    for block in ("block_01", "block_02"):
        run = json.loads((workdir / "results" / "train" / block / "run.json").read_text())
        assert run["profile"]["name"] != "cpu" and name in run["device"]
        assert "matches" in run["profile_reason"] or "meet" in run["profile_reason"]
        epochs = json.loads((workdir / "results" / "train" / block / "epochs.json").read_text())
        assert epochs[0]["peak_memory_gb"] > 0 and epochs[0]["images_per_second"] > 0
        # every step after the first timed on the GPU's clock; the process's objects frozen (scripts/gc_freeze.py)
        assert all(seconds > 0 for seconds in epochs[0]["step_seconds"]) and epochs[0]["step_seconds"]
        assert epochs[0]["frozen_objects"] > 10_000
    assert (
        "Host threads of the training process: 1"
        in (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    )
    profile = json.loads(next((workdir / "results" / "train" / "state").glob("*/profile.json")).read_text())
    assert profile["profile"]["name"] == run["profile"]["name"]


def test_fp8_without_transformer_engine_stops_before_training(workdir, server, archives):
    write_config(workdir, gpu_config(workdir, server, archives, epochs=1, profile="rtx-pro-6000-fp8"))
    result = run_snakemake(workdir)
    assert result.returncode != 0
    assert "asks for the FP8 route, which cannot run here" in result.stdout
    assert "Transformer Engine does not import" in result.stdout
    assert not (workdir / "results" / "train" / "block_01" / "checkpoint.ckpt").exists()

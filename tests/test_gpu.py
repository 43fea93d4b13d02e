"""On a CUDA GPU, through the real `snakemake` (run there with `pytest -m gpu -o addopts=""`; README "Test it"):
the train rule as a user gets it on the H200 (compile and static CUDA graphs), the FP8 route, and the GPU's own faults
(too many GPUs asked for, out of memory, a loss that is no longer finite)."""

from __future__ import annotations

import importlib.util
import json
import os
import re

import pytest
import torch

from rfdetr_coco_pipeline.hooks import BY_DEFAULT, NAMES
from tests.helpers.archive_server import ArchiveServer
from tests.helpers.tiny_coco import make_archives, make_dataset
from tests.helpers.workflow import run_snakemake, tiny_config, write_config

pytestmark = pytest.mark.gpu  # left out by default (pyproject addopts); `pytest -m gpu` on a GPU machine
TRANSFORMER_ENGINE = importlib.util.find_spec("transformer_engine") is not None


def write_gpu_config(workdir, config) -> None:
    """The GPU tests' config: no export stage (ONNX export is the CPU tests' concern, and the GPU machine's
    wheelhouse has no onnx)."""
    config["export"]["formats"] = []
    write_config(workdir, config)


def read_block(workdir, block: str, name: str):
    return json.loads((workdir / "results" / "train" / block / name).read_text())


def test_more_gpus_than_the_machine_has_stop_the_run_before_the_first_download(workdir, server, archives):
    """The check_gpus job, through snakemake: it stops the run before anything is fetched."""
    visible = torch.cuda.device_count()
    write_gpu_config(workdir, tiny_config(workdir, server.url, archives, device="cuda", gpus=visible + 1))
    result = run_snakemake(workdir)
    assert result.returncode != 0
    assert f"train.gpus is {visible + 1}, but this job sees {visible} GPU(s)" in result.stdout, result.stdout[-3000:]
    assert server.requests == []  # stopped before the first download


def test_the_h200_row_as_a_user_gets_it_captures_and_replays_cuda_graphs(workdir, server, archives):
    on_h200 = "H200" in torch.cuda.get_device_name(0)
    config = tiny_config(
        workdir, server.url, archives, device="cuda", profile="auto" if on_h200 else "h200", epochs=2
    )  # the shipped gpu_profiles, untouched: compile and CUDA graphs on, batch 128
    write_gpu_config(workdir, config)
    result = run_snakemake(workdir)
    assert result.returncode == 0, result.stdout[-5000:]
    # the evaluate stage runs on the GPU too, in the run's precision (bf16), without compile (load_for_inference)
    evaluation = json.loads((workdir / "results" / "eval" / "metrics.json").read_text())
    assert evaluation["device"] == "cuda" and evaluation["precision"] == "bf16"
    assert 0 <= evaluation["AP"] <= 1 and evaluation["images"] == config["verify"]["expected_images"]["val2017"]
    # the compile warm-up compiled the training step's graphs beside the download, and the first block found them
    # in the cache. The model's forward and backward graphs are most of them; rfdetr's matcher cost
    # (pairwise_box_l1_cost) compiles a variant per case of its inputs' storage offset, and the first block may meet
    # a case the warm-up's few images did not.
    warmup = json.loads((workdir / "results" / "train" / "compile_warmup.json").read_text())
    assert warmup["compiled"] and warmup["profile"] == "h200", warmup
    assert warmup["compile_cache"]["graph_misses"] > 0 and warmup["compile_cache"]["graph_hits"] == 0, warmup
    (first_epoch,) = read_block(workdir, "block_01", "epochs.json")
    lookups = first_epoch["compile_cache"]
    assert lookups["graph_hits"] > lookups["graph_misses"], lookups
    assert lookups["graph_misses"] < warmup["compile_cache"]["graph_misses"], (lookups, warmup)
    for block in ("block_01", "block_02"):
        run = read_block(workdir, block, "run.json")
        assert run["profile"]["name"] == "h200" and run["profile"]["compile"] and run["profile"]["cuda_graphs"]
        assert torch.cuda.get_device_name(0) in run["device"]
        if on_h200:
            assert "matches 'H200'" in run["profile_reason"]
        # auto applies every speedup of BY_DEFAULT; only those that apply only when named are left off
        assert "static_cuda_graphs" in run["speedups"]
        assert set(run["speedups_left_off"]) == set(NAMES) - set(BY_DEFAULT)
        log = (workdir / "results" / "logs" / "train" / f"{block}.log").read_text()
        assert "CUDA graphs: compiled for one fixed input shape, CUDA graph replay on" in log
        # every process (each block is one) captures its graphs, then replays them step after step
        captured, replayed = map(
            int, re.findall(r"CUDA graphs after epoch \d+: (\d+) captured, (\d+) replays", log)[-1]
        )
        assert captured >= 2 and replayed > captured, (captured, replayed)
        (epoch,) = read_block(workdir, block, "epochs.json")
        assert epoch["peak_memory_gb"] > 0 and epoch["images_per_second"] > 0
        # every step after the first timed on the GPU's clock; the process's objects frozen (the gc_freeze speedup)
        assert epoch["step_seconds"] and all(seconds > 0 for seconds in epoch["step_seconds"])
        assert epoch["frozen_objects"] > 10_000
        assert "Host threads of the training process: 1" in log
    # the second block resumed from the first's last.ckpt, which checkpoints_in_background wrote from host copies
    assert "resuming from the previous block's checkpoint" in (workdir / "results/logs/train/block_02.log").read_text()
    saved = torch.load(workdir / "results/train/block_01/checkpoint.ckpt", weights_only=False)
    assert saved["epoch"] == 0 and {t.device.type for t in saved["state_dict"].values()} == {"cpu"}


@pytest.mark.skipif(not TRANSFORMER_ENGINE, reason="Transformer Engine is not installed (README: 'The FP8 route')")
def test_the_fp8_route_trains_an_epoch_and_validates_with_transformer_engine(workdir, server, archives):
    config = tiny_config(workdir, server.url, archives, device="cuda", profile="rtx-pro-6000-fp8", epochs=1)
    write_gpu_config(workdir, config)
    result = run_snakemake(workdir)
    assert result.returncode == 0, result.stdout[-5000:]
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert re.search(r"Captured CUDA graph 1 for input shape .* Backend: Transformer Engine FP8\.", log)
    (epoch,) = read_block(workdir, "block_01", "epochs.json")
    assert epoch["val_seconds"] > 0 and len(epoch["loss"]) >= 1
    assert all(loss == loss and loss < 1e4 for loss in epoch["loss"])  # finite
    assert read_block(workdir, "block_01", "run.json")["profile"]["precision"] == "fp8"


@pytest.mark.skipif(not TRANSFORMER_ENGINE, reason="Transformer Engine is not installed (README: 'The FP8 route')")
def test_the_fp8_route_validates_a_validation_set_no_batch_size_splits_for_fp8(tmp_path):
    """5 validation images: a batch of 4 in FP8, then the last image alone, which Transformer Engine's FP8 layers
    refuse (20 backbone rows at 64 px), without FP8 (the `fp8_validation` hook)."""
    make_dataset(tmp_path / "coco", n_train=8, n_val=5)
    archives = make_archives(tmp_path / "coco", tmp_path / "archives")
    workdir = tmp_path / "work"
    with ArchiveServer(tmp_path / "archives") as server:
        config = tiny_config(workdir, server.url, archives, device="cuda", profile="rtx-pro-6000-fp8", epochs=1)
        config["verify"]["expected_images"]["val2017"] = 5
        write_config(workdir, config)
        result = run_snakemake(workdir, "results/train/block_01/run.json")
    assert result.returncode == 0, result.stdout[-5000:]
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "Validation batch: 4 images" in log
    assert "The last validation batch (1 per GPU) is no multiple of 2" in log
    (epoch,) = read_block(workdir, "block_01", "epochs.json")
    assert epoch["val_seconds"] > 0


@pytest.mark.skipif(TRANSFORMER_ENGINE, reason="Transformer Engine is installed here: the FP8 route can run")
def test_fp8_without_transformer_engine_stops_before_training(workdir, server, archives):
    config = tiny_config(workdir, server.url, archives, device="cuda", profile="rtx-pro-6000-fp8", epochs=1)
    write_config(workdir, config)
    result = run_snakemake(workdir)
    assert result.returncode != 0
    assert "asks for the FP8 route, which cannot run here" in result.stdout
    assert "Transformer Engine does not import" in result.stdout
    assert not (workdir / "results" / "train" / "block_01" / "checkpoint.ckpt").exists()


def test_a_gpu_out_of_memory_ends_the_block_with_what_to_change(workdir, server, archives):
    """A profile whose batch no GPU holds (4,096 images at 384 px): the job's last words say what happened and what
    to change, not torch's traceback."""
    config = tiny_config(
        workdir, server.url, archives, device="cuda", epochs=1, resolution=384, profile="too-big", compile_warmup=False
    )
    too_big = {"name": "too-big", "auto": False, "batch_size": 4096, "precision": "bf16"}
    config["gpu_profiles"].append({**too_big, "compile": False, "cuda_graphs": False})
    write_gpu_config(workdir, config)
    result = run_snakemake(workdir, "results/train/block_01/run.json")
    assert result.returncode != 0
    assert "The GPU ran out of memory" in result.stdout and "GPU profile 'too-big' (batch_size 4096" in result.stdout
    assert "Pin a gpu_profiles row with a smaller batch_size" in result.stdout


def test_a_loss_that_is_no_longer_finite_stops_the_block_on_the_gpu_too(workdir, server, archives, tmp_path):
    """The NaN guard where it checks without waiting for the GPU (a step later): compiled, with CUDA graphs where
    the profile has them; the block stops in the epoch the loss went bad and the last good checkpoint stays."""
    from tests.test_training_faults import NAN_FAULT

    site = tmp_path / "nan-fault"
    for name, text in NAN_FAULT.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    write_gpu_config(workdir, tiny_config(workdir, server.url, archives, device="cuda", epochs=2, epochs_per_block=2))
    # prepended: on the GPU machine PYTHONPATH also carries the installed wheels
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    failed = run_snakemake(workdir, "results/train/block_01/run.json", env={"PYTHONPATH": path})
    assert failed.returncode != 0
    assert re.search(r"The training loss is no longer finite \(NaN or infinite\) at epoch 2, step \d+", failed.stdout)
    (last,) = (workdir / "results" / "train" / "state").glob("*/last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 0  # epoch 1's, not overwritten

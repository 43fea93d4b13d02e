"""GPU profile resolution and the route's settling: the FP8 checks and CUDA graphs (the shipped profile table, on
devices described as the GPUs report themselves)."""

from __future__ import annotations

import pytest

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.training.device import Device, check_gpu_count, detect_device
from rfdetr_coco_pipeline.training.profiles import resolve_profile
from rfdetr_coco_pipeline.training.route import settle_route
from rfdetr_coco_pipeline.versions import package_version
from tests.helpers.workflow import settings_of

PROFILES = settings_of().gpu_profiles
RFDETR = package_version("rfdetr")


def route(device: Device, te_problem=None, **train):
    """The settled route on `device` (the stock rfdetr's unless speedups are named), with Transformer Engine as
    found here unless `te_problem` says otherwise."""
    settings = settings_of(**{"speedups": "none", **train})
    extra = {} if te_problem is None else {"te_problem": te_problem}
    return settle_route(settings, RFDETR, device, **extra)


def gpu(name: str, capability=(9, 0), memory_gb=80.0) -> Device:
    return Device("cuda", name, capability, memory_gb, 1)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A10", "rtx-a6000-a10"),
        ("NVIDIA RTX A6000", "rtx-a6000-a10"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("Tesla T4", "t4"),
        ("Quadro RTX 6000", "t4"),
    ],
)
def test_every_notebook_gpu_matches_its_row_by_name(name, expected):
    profile, reason = resolve_profile(PROFILES, gpu(name))
    assert profile.name == expected and "matches" in reason


def test_the_notebook_table_is_carried_over():
    rows = {p.name: p for p in PROFILES}
    assert (rows["rtx-pro-6000"].batch_size, rows["l4"].batch_size, rows["a100"].batch_size) == (128, 32, 64)
    assert rows["t4"].precision == "fp16"
    assert not rows["rtx-pro-6000-fp8"].auto
    assert rows["rtx-pro-6000-fp8"].cuda_graphs and not rows["rtx-pro-6000-fp8"].compile
    for row in (p for p in PROFILES if p.name not in ("cpu", "h200")):  # Inductor graphs at batch <= 16, or TE
        assert row.cuda_graphs == (row.batch_size <= 16 or row.precision == "fp8"), row.name
    # measured on the H200 (BENCHMARKS.md): graphs of the model compiled for the one training shape, at batch 128
    assert rows["h200"].cuda_graphs and rows["h200"].batch_size == 128


def test_unknown_gpus_fall_back_to_compute_capability_and_memory():
    assert resolve_profile(PROFILES, gpu("Future GPU 96GB", (10, 0), 96))[0].name == "generic-80gb"
    assert resolve_profile(PROFILES, gpu("Mid GPU", (8, 6), 48))[0].name == "generic-40gb"
    assert resolve_profile(PROFILES, gpu("Small GPU", (8, 9), 16))[0].name == "generic-ampere"
    profile, reason = resolve_profile(PROFILES, gpu("Old GPU", (7, 0), 16))
    assert profile.name == "generic-older" and profile.precision == "fp16" and "compute capability 7.0" in reason


def test_a_pinned_profile_wins_and_an_unknown_name_is_an_error():
    profile, reason = resolve_profile(PROFILES, gpu("NVIDIA H200"), "a100")
    assert profile.name == "a100" and "pinned" in reason
    with pytest.raises(StageError, match="unknown GPU profile 'b200'"):
        resolve_profile(PROFILES, gpu("NVIDIA H200"), "b200")


def test_without_a_gpu_the_job_stops_unless_it_is_a_cpu_run():
    with pytest.raises(StageError, match="No CUDA GPU is visible.*train.device: cpu"):
        detect_device("cuda")  # this machine has no GPU: the real check, not a stand-in
    assert resolve_profile(PROFILES, detect_device("cpu"))[0].name == "cpu"


FP8 = next(p for p in PROFILES if p.precision == "fp8")
H200 = next(p for p in PROFILES if p.name == "h200")


def test_fp8_without_transformer_engine_is_an_error_naming_the_fix():
    with pytest.raises(StageError, match="Transformer Engine does not import.*fp8_fallback: bf16"):
        route(gpu("NVIDIA H200"), profile=FP8.name)  # not installed here: a real import failure


def test_fp8_below_compute_capability_8_9_is_an_error():
    with pytest.raises(StageError, match="compute capability 8.0; FP8 needs 8.9"):
        route(gpu("NVIDIA A100", (8, 0)), lambda: None, profile=FP8.name)


def test_fp8_with_an_unsupported_recipe_names_each_setting():
    unsupported = {"grad_accum_steps": 2, "multi_scale": True, "square_resize_div_64": False}
    with pytest.raises(StageError) as error:
        route(gpu("NVIDIA H200"), lambda: None, profile=FP8.name, **unsupported)
    for key in ("grad_accum_steps: 1", "multi_scale: false", "square_resize_div_64: true"):
        assert key in str(error.value)


def test_fp8_falls_back_to_compiled_bf16_when_the_config_asks():
    settled = route(gpu("NVIDIA H200"), profile=FP8.name, fp8_fallback="bf16")
    profile = settled.profile
    assert (profile.precision, profile.compile, profile.cuda_graphs) == ("bf16", True, False)
    assert profile.batch_size == FP8.batch_size and "fp8_fallback: bf16" in settled.reason
    assert settled.batch_multiple == 1


def test_fp8_passes_when_everything_holds():
    settled = route(gpu("NVIDIA H200"), lambda: None, profile=FP8.name)
    assert settled.profile == FP8 and settled.batch_multiple == 2  # the FP8 layers' rule at 384 px


@pytest.mark.parametrize(
    "setting", [{"gpus": 2}, {"grad_accum_steps": 4}, {"multi_scale": True}, {"square_resize_div_64": False}]
)
def test_cuda_graphs_are_turned_off_where_rfdetr_cannot_replay_them(setting):
    two = Device("cuda", "NVIDIA H200", (9, 0), 141.0, 2)
    settled = route(two, speedups=["static_cuda_graphs"], **setting)
    assert not settled.profile.cuda_graphs and settled.profile.batch_size == H200.batch_size
    assert "cuda_graphs off" in settled.reason and "train.gpus: 1" in settled.reason
    kept = route(two, speedups=["static_cuda_graphs"])
    assert kept.profile == H200 and "cuda_graphs off" not in kept.reason


def test_without_the_static_graphs_speedup_large_batches_leave_cuda_graphs_off_as_the_notebook_does():
    settled = route(gpu("NVIDIA H200"))
    profile = settled.profile
    assert not profile.cuda_graphs and profile.compile and "static_cuda_graphs speedup is not applied" in settled.reason
    small = route(gpu("NVIDIA A2", (8, 6), 16))  # generic-ampere, batch 16: rfdetr's own graphs, as the notebook
    assert small.profile.name == "generic-ampere" and small.profile.cuda_graphs


def test_more_gpus_than_the_job_sees_stop_with_the_setting_to_change(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    one_h200 = Device("cuda", "NVIDIA H200", (9, 0), 141.0, 1)
    with pytest.raises(StageError) as stop:
        check_gpu_count(one_h200, 2)
    message = str(stop.value)
    assert "train.gpus is 2" in message and "sees 1 GPU" in message and "CUDA_VISIBLE_DEVICES: 3" in message
    assert "at most 1 in config.yaml" in message
    check_gpu_count(one_h200, 1)
    check_gpu_count(Device("cuda", "NVIDIA H200", (9, 0), 141.0, 2), 2)
    check_gpu_count(Device("cpu", "cpu"), 2)  # DDP on the CPU: processes, not devices

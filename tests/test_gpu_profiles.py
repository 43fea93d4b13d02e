"""GPU profile resolution and the FP8 route's checks (pure functions; the shipped profile table)."""

from __future__ import annotations

import pytest

from pipeline.common import StageError
from pipeline.gpu_profiles import Device, check_gpu_count, detect_device, resolve_profile, settle_profile
from tests.helpers.workflow import base_config

PROFILES = base_config()["gpu_profiles"]
TRAIN = base_config()["train"]


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
    assert profile["name"] == expected and "matches" in reason


def test_the_notebook_table_is_carried_over():
    rows = {p["name"]: p for p in PROFILES}
    assert (rows["rtx-pro-6000"]["batch_size"], rows["l4"]["batch_size"], rows["a100"]["batch_size"]) == (128, 32, 64)
    assert rows["t4"]["precision"] == "fp16"
    assert rows["rtx-pro-6000-fp8"] | {"auto": False} == rows["rtx-pro-6000-fp8"]
    assert rows["rtx-pro-6000-fp8"]["cuda_graphs"] and not rows["rtx-pro-6000-fp8"]["compile"]
    for row in (p for p in PROFILES if p["name"] not in ("cpu", "h200")):  # Inductor graphs at batch <= 16, or TE
        assert row["cuda_graphs"] == (row["batch_size"] <= 16 or row["precision"] == "fp8"), row["name"]
    # measured on the H200 (BENCHMARKS.md): graphs of the model compiled for the one training shape, at batch 128
    assert rows["h200"]["cuda_graphs"] and rows["h200"]["batch_size"] == 128


def test_unknown_gpus_fall_back_to_compute_capability_and_memory():
    assert resolve_profile(PROFILES, gpu("Future GPU 96GB", (10, 0), 96))[0]["name"] == "generic-80gb"
    assert resolve_profile(PROFILES, gpu("Mid GPU", (8, 6), 48))[0]["name"] == "generic-40gb"
    assert resolve_profile(PROFILES, gpu("Small GPU", (8, 9), 16))[0]["name"] == "generic-ampere"
    profile, reason = resolve_profile(PROFILES, gpu("Old GPU", (7, 0), 16))
    assert profile["name"] == "generic-older" and profile["precision"] == "fp16" and "compute capability 7.0" in reason


def test_a_pinned_profile_wins_and_an_unknown_name_is_an_error():
    profile, reason = resolve_profile(PROFILES, gpu("NVIDIA H200"), "a100")
    assert profile["name"] == "a100" and "pinned" in reason
    with pytest.raises(StageError, match="unknown GPU profile 'b200'"):
        resolve_profile(PROFILES, gpu("NVIDIA H200"), "b200")


def test_without_a_gpu_the_job_stops_unless_it_is_a_cpu_run():
    with pytest.raises(StageError, match="No CUDA GPU is visible.*train.device: cpu"):
        detect_device("cuda")  # this machine has no GPU: the real check, not a stand-in
    assert resolve_profile(PROFILES, detect_device("cpu"))[0]["name"] == "cpu"


FP8 = next(p for p in PROFILES if p["precision"] == "fp8")


def test_fp8_without_transformer_engine_is_an_error_naming_the_fix():
    with pytest.raises(StageError, match="Transformer Engine does not import.*fp8_fallback: bf16"):
        settle_profile(FP8, "pinned", gpu("NVIDIA H200"), TRAIN)  # not installed here: a real import failure


def test_fp8_below_compute_capability_8_9_is_an_error():
    with pytest.raises(StageError, match="compute capability 8.0; FP8 needs 8.9"):
        settle_profile(FP8, "pinned", gpu("NVIDIA A100", (8, 0)), TRAIN, te_problem=lambda: None)


def test_fp8_with_an_unsupported_recipe_names_each_setting():
    train = {**TRAIN, "grad_accum_steps": 2, "multi_scale": True, "square_resize_div_64": False}
    with pytest.raises(StageError) as error:
        settle_profile(FP8, "pinned", gpu("NVIDIA H200"), train, te_problem=lambda: None)
    for key in ("grad_accum_steps: 1", "multi_scale: false", "square_resize_div_64: true"):
        assert key in str(error.value)


def test_fp8_falls_back_to_compiled_bf16_when_the_config_asks():
    profile, reason = settle_profile(FP8, "pinned", gpu("NVIDIA H200"), {**TRAIN, "fp8_fallback": "bf16"})
    assert (profile["precision"], profile["compile"], profile["cuda_graphs"]) == ("bf16", True, False)
    assert profile["batch_size"] == FP8["batch_size"] and "fp8_fallback: bf16" in reason


def test_fp8_passes_when_everything_holds():
    profile, _ = settle_profile(FP8, "pinned", gpu("NVIDIA H200"), TRAIN, te_problem=lambda: None)
    assert profile == FP8


@pytest.mark.parametrize(
    "setting", [{"gpus": 2}, {"grad_accum_steps": 4}, {"multi_scale": True}, {"square_resize_div_64": False}]
)
def test_cuda_graphs_are_turned_off_where_rfdetr_cannot_replay_them(setting):
    h200 = next(p for p in PROFILES if p["name"] == "h200")
    profile, reason = settle_profile(h200, "matched", gpu("NVIDIA H200"), {**TRAIN, **setting})
    assert not profile["cuda_graphs"] and profile["batch_size"] == h200["batch_size"]
    assert "cuda_graphs off" in reason and "train.gpus: 1" in reason
    assert settle_profile(h200, "matched", gpu("NVIDIA H200"), TRAIN) == (h200, "matched")


def test_without_the_static_graphs_speedup_large_batches_leave_cuda_graphs_off_as_the_notebook_does():
    h200 = next(p for p in PROFILES if p["name"] == "h200")
    profile, reason = settle_profile(h200, "matched", gpu("NVIDIA H200"), TRAIN, static_graphs=False)
    assert not profile["cuda_graphs"] and profile["compile"] and "static_cuda_graphs speedup is not applied" in reason
    small = next(p for p in PROFILES if p["name"] == "generic-ampere")  # batch 16: rfdetr's own graphs, as the notebook
    assert settle_profile(small, "met", gpu("NVIDIA A2"), TRAIN, static_graphs=False) == (small, "met")


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

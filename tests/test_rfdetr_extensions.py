"""The registry of speedups (rfdetr_extensions): what train.speedups selects for the installed rfdetr, that each
patch replaces what the registry says inside its block only, that each speedup can be applied alone, and that the
README's table is the registry's."""

from __future__ import annotations

import argparse
import json
import logging
import pkgutil
import re
import sys
from pathlib import Path

import pytest

from rfdetr_extensions import (
    CHECKED_RFDETR,
    NAMES,
    SPEEDUPS,
    SpeedupError,
    SpeedupOptions,
    applied,
    markdown_table,
    select_speedups,
)
from rfdetr_extensions.patching import installed_rfdetr
from rfdetr_extensions.trainer_hook import extra_callbacks

REPO = Path(__file__).resolve().parents[1]
PATCHES = [speedup for speedup in SPEEDUPS if speedup.kind == "patch"]
OPTIONS = SpeedupOptions(loader_niceness=10)  # nice_loader_workers replaces nothing at niceness 0


def owner_and_name(path: str) -> tuple[object, str]:
    """ "module:Class.attribute" or "module:attribute" -> (the object that holds the attribute, its name)."""
    module, _, attribute = path.partition(":")
    owner, _, name = attribute.rpartition(".")
    return pkgutil.resolve_name(f"{module}:{owner}" if owner else module), name


def test_the_registry_names_each_speedup_once_with_a_test_that_exists():
    assert len(NAMES) == len(set(NAMES)) == 23
    for speedup in SPEEDUPS:
        file, _, test = speedup.test.partition("::")
        assert re.search(rf"^def {test}\(", (REPO / file).read_text(), re.MULTILINE), speedup.test
        assert speedup.load() is not None  # the entry point imports


@pytest.mark.parametrize("speedup", PATCHES, ids=[speedup.name for speedup in PATCHES])
def test_rfdetrs_code_is_replaced_inside_the_block_and_restored_after(speedup):
    targets = [owner_and_name(path) for path in speedup.replaces]
    originals = [getattr(owner, name) for owner, name in targets]
    with applied(select_speedups([speedup.name], CHECKED_RFDETR), OPTIONS):
        assert all(
            getattr(owner, name) is not original for (owner, name), original in zip(targets, originals, strict=True)
        )
    assert all(getattr(owner, name) is original for (owner, name), original in zip(targets, originals, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_every_speedup_can_be_applied_alone(name):
    selection = select_speedups([name], CHECKED_RFDETR)
    assert selection.names() == [name] and len(selection.left_off) == len(NAMES) - 1
    own = next(speedup.replaces for speedup in SPEEDUPS if speedup.name == name)
    others = [
        owner_and_name(path)
        for speedup in PATCHES
        if speedup.name != name
        for path in speedup.replaces
        if path not in own  # two speedups may replace one function (images_as_bytes and its validation side)
    ]
    before = [getattr(owner, attribute) for owner, attribute in others]
    with applied(selection, OPTIONS) as callbacks:
        assert [getattr(owner, attribute) for owner, attribute in others] == before  # nothing else replaced
        kind = next(speedup.kind for speedup in SPEEDUPS if speedup.name == name)
        assert len(callbacks) == (kind == "callback")


def test_auto_applies_everything_with_the_checked_rfdetr_and_nothing_with_another_saying_why():
    assert select_speedups("auto", CHECKED_RFDETR, missing=()).names() == list(NAMES)
    other = select_speedups("auto", "1.12.0")
    assert other.applied == () and len(other.left_off) == len(NAMES)
    report = other.report()
    assert report[0].startswith(f"Speedups applied (0 of {len(NAMES)}): none")
    assert all(
        f"checked against rfdetr {CHECKED_RFDETR}, but rfdetr 1.12.0 is installed" in line for line in report[1:]
    )
    assert [line.split(":")[1].strip() for line in report[1:]] == list(NAMES)


@pytest.mark.parametrize("setting", ["all", ["gc_freeze", "deformable_sampling"]])
def test_asking_for_speedups_by_name_or_all_refuses_another_rfdetr_with_what_to_do(setting):
    with pytest.raises(SpeedupError, match=rf"rfdetr 1\.12\.0 is installed\. Install rfdetr=={CHECKED_RFDETR}"):
        select_speedups(setting, "1.12.0")
    expected = list(NAMES) if setting == "all" else ["deformable_sampling", "gc_freeze"]  # in the registry's order
    assert select_speedups(setting, CHECKED_RFDETR, missing=()).names() == expected


def test_without_triton_auto_leaves_deformable_sampling_off_and_all_refuses(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as in a Python where triton does not import
    auto = select_speedups("auto", CHECKED_RFDETR)
    assert auto.names() == [name for name in NAMES if name != "deformable_sampling"]
    assert "Speedup left off: deformable_sampling: needs triton, which this Python cannot import" in auto.report()
    for setting in ("all", ["gc_freeze", "deformable_sampling"]):
        with pytest.raises(SpeedupError, match=r"deformable_sampling needs triton.*pip install triton.*speedups: auto"):
            select_speedups(setting, CHECKED_RFDETR)
    assert select_speedups(["gc_freeze"], CHECKED_RFDETR).names() == ["gc_freeze"]
    # where triton imports, all and a list naming deformable_sampling apply it
    assert select_speedups("all", CHECKED_RFDETR, missing=()).names() == list(NAMES)
    assert select_speedups(["deformable_sampling"], CHECKED_RFDETR, missing=()).names() == ["deformable_sampling"]


def test_on_the_cpu_auto_leaves_the_gpu_only_speedups_off_and_all_applies_them():
    gpu_only = [speedup.name for speedup in SPEEDUPS if speedup.gpu_only]
    assert "matching_in_workers" in gpu_only
    on_cpu = select_speedups("auto", CHECKED_RFDETR, missing=(), device_kind="cpu")
    assert on_cpu.names() == [name for name in NAMES if name not in gpu_only]
    for name in gpu_only:
        assert (
            f"Speedup left off: {name}: gains only when training runs on a GPU (train.device: cpu)" in on_cpu.report()
        )
    assert select_speedups("auto", CHECKED_RFDETR, missing=(), device_kind="cuda").names() == list(NAMES)
    # asked for by name, or with all, they apply on the CPU too: they compute rfdetr's values there as well
    assert select_speedups("all", CHECKED_RFDETR, missing=(), device_kind="cpu").names() == list(NAMES)
    assert select_speedups(gpu_only, CHECKED_RFDETR, missing=(), device_kind="cpu").names() == gpu_only


def test_none_applies_nothing_and_unknown_names_are_refused():
    none = select_speedups("none", CHECKED_RFDETR)
    assert none.applied == () and {why for _, why in none.left_off} == {"train.speedups: none"}
    with pytest.raises(SpeedupError, match="unknown speedup.*fastest"):
        select_speedups(["gc_freeze", "fastest"], CHECKED_RFDETR)
    with pytest.raises(SpeedupError, match="'some'"):
        select_speedups("some", CHECKED_RFDETR)


def test_the_install_pins_the_checked_rfdetr_and_it_is_the_one_this_python_imports():
    install = (REPO / "pyproject.toml").read_text() + (REPO / "envs" / "pipeline.yaml").read_text()
    pins = re.findall(r"rfdetr(?:\[[\w,]+\])?==([\w.]+)", install)
    assert len(pins) >= 3 and set(pins) == {CHECKED_RFDETR}, pins  # the dependency, the onnx extra, conda's
    assert installed_rfdetr() == CHECKED_RFDETR


def test_the_trainer_hook_adds_callbacks_inside_the_block_only():
    import rfdetr.training

    original = rfdetr.training.build_trainer
    with extra_callbacks(["a callback"]):
        assert rfdetr.training.build_trainer is not original
    assert rfdetr.training.build_trainer is original


def test_the_fp8_validation_hook_wraps_rfdetrs_validation_step_inside_the_block_only():
    from rfdetr.training.module_model import RFDETRModelModule

    from rfdetr_extensions.fp8_validation import validation_of_any_size

    original = RFDETRModelModule.validation_step
    with validation_of_any_size(2):
        assert RFDETRModelModule.validation_step is not original
    assert RFDETRModelModule.validation_step is original


def test_the_readme_shows_the_registry():
    readme = (REPO / "README.md").read_text()
    assert markdown_table() in readme, "README.md's speedup table differs: paste `python -m rfdetr_extensions`"


@pytest.mark.slow
def test_with_another_rfdetr_auto_trains_with_stock_rfdetr_and_the_log_lists_what_was_left_off(
    tiny_dataset, tmp_path, caplog, monkeypatch
):
    """The train stage given the installed rfdetr's version as "1.12.0": one real epoch of rfdetr on the CPU."""
    from pipeline.common import read_json, write_json
    from pipeline.recipe import RECIPE_KEYS
    from scripts.train import train_block
    from tests.helpers.workflow import base_config

    for cache in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_FX_GRAPH_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
    ):
        monkeypatch.setenv(cache, str(tmp_path / "cache"))  # restored after the test
    settings = base_config()
    settings["train"].update(epochs=1, resolution=64, device="cpu", max_workers=0, speedups="auto")
    write_json(tmp_path / "stage.json", {"path": str(tiny_dataset), "where": "disk"})
    args = argparse.Namespace(
        recipe=json.dumps({key: settings["train"][key] for key in RECIPE_KEYS}),
        start_epoch=0,
        end_epoch=1,
        previous_block=None,
        stage_report=tmp_path / "stage.json",
        state_root=tmp_path / "state",
        outdir=tmp_path / "block_01",
        threads=2,
    )
    with caplog.at_level(logging.INFO):
        train_block(args, settings, "1.12.0")
    run = read_json(tmp_path / "block_01" / "run.json")
    assert run["speedups"] == [] and run["recipe"]["rfdetr"] == "1.12.0"
    assert (tmp_path / "block_01" / "checkpoint.ckpt").is_file()
    assert f"Speedups applied (0 of {len(NAMES)}): none" in caplog.text
    for name in NAMES:
        assert f"Speedup left off: {name}: checked against rfdetr {CHECKED_RFDETR}, but rfdetr 1.12.0" in caplog.text

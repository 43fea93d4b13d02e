"""The registry of hooks (rfdetr_coco_pipeline.hooks): the gate that keeps a hook off when a target changed, what
train.speedups selects for the installed rfdetr, that each patch replaces what the registry says inside its block
only, that each speedup can be applied alone, that the workflow's callbacks reach the Trainers built inside their
block only, and that docs/speedups.md shows the registry."""

from __future__ import annotations

import logging
import pkgutil
import re
import sys
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.hooks import (
    BY_DEFAULT,
    CHECKED_RFDETR,
    HOOKS,
    NAMES,
    SPEEDUPS,
    SpeedupError,
    all_targets,
    applied,
    check_hooks,
    gate,
    hooks_table,
    markdown_table,
    select_speedups,
)
from rfdetr_coco_pipeline.hooks.checked_sources import CHECKED
from rfdetr_coco_pipeline.hooks.trainer_plugins import trainer_plugins
from rfdetr_coco_pipeline.training.callbacks import active_callbacks, attached
from rfdetr_coco_pipeline.versions import package_version
from tests.helpers.workflow import base_config, settings_of

REPO = Path(__file__).resolve().parents[1]
PATCHES = [speedup for speedup in SPEEDUPS if speedup.kind == "patch"]
OPTIONS = settings_of(loader_niceness=10).train  # nice_loader_workers replaces nothing at niceness 0


def owner_and_name(path: str) -> tuple[object, str]:
    """ "module:Class.attribute" or "module:attribute" -> (the object that holds the attribute, its name)."""
    module, _, attribute = path.partition(":")
    owner, _, name = attribute.rpartition(".")
    return pkgutil.resolve_name(f"{module}:{owner}" if owner else module), name


# The test that shows each speedup gives rfdetr's values (docs/speedups.md points here)
SPEEDUP_TESTS = {
    "targets_one_copy": "tests/test_targets_one_copy.py::test_one_copy_per_field_gives_rfdetrs_targets",
    "matches_on_device": "tests/test_matches_on_device.py::"
    "test_the_loss_is_the_same_with_and_without_the_extension_on_the_cpu",
    "matching_without_waiting": "tests/test_matching_without_waiting.py::test_the_loss_and_the_matches_are_rfdetrs",
    "target_counts_without_waiting": "tests/test_target_counts_without_waiting.py::test_the_batched_losses_are_rfdetrs",
    "gather_matched_targets": "tests/test_gather_matched_targets.py::test_each_layers_matched_targets_equal_rfdetrs",
    "ema_without_waiting": "tests/test_ema_without_waiting.py::"
    "test_the_ema_weights_and_counter_equal_rfdetrs_over_many_steps",
    "lr_log_on_device": "tests/test_lr_log_on_device.py::test_the_same_values_names_and_settings_reach_lightning",
    "progress_bar_without_waiting": "tests/test_progress_bar_without_waiting.py::"
    "test_on_the_cpu_the_bar_shows_lightnings_values",
    "nice_loader_workers": "tests/test_nice_loader_workers.py::test_workers_run_niced_and_load_the_same_items",
    "batch_copy_beside_the_step": "tests/test_batch_copy_beside_the_step.py::"
    "test_on_the_gpu_the_images_arrive_with_rfdetrs_values_while_the_queued_work_runs",
    "images_as_bytes": "tests/test_images_as_bytes.py::"
    "test_training_batches_travel_as_bytes_and_arrive_as_rfdetrs_floats",
    "validation_images_as_bytes": "tests/test_images_as_bytes.py::"
    "test_validation_batches_travel_as_bytes_and_arrive_as_rfdetrs_floats",
    "normalization_in_one_kernel": "tests/test_normalization_in_one_kernel.py::"
    "test_in_tritons_interpreter_the_kernel_gives_the_floats_bit_for_bit",
    "resize_in_torch": "tests/test_resize_in_torch.py::"
    "test_training_images_keep_rfdetrs_boxes_and_come_within_two_levels_of_its_pixels",
    "deformable_sampling": "tests/test_deformable_sampling.py::"
    "test_in_tritons_interpreter_the_kernels_give_grid_samples_values_and_gradients",
    "patch_embedding_as_product": "tests/test_patch_embedding_as_product.py::"
    "test_the_step_embeds_without_the_convolution_and_gives_rfdetrs_loss_and_gradients",
    "backbone_norm_backward_in_one_pass": "tests/test_backbone_norm_backward.py::"
    "test_in_tritons_interpreter_a_nano_training_step_gives_rfdetrs_loss_and_gradients",
    "backbone_maps_in_one_buffer": "tests/test_backbone_maps_in_one_buffer.py::"
    "test_the_maps_are_rfdetrs_bit_for_bit_as_slices_of_one_channels_last_buffer",
    "decoder_attention_on_views": "tests/test_decoder_layer.py::test_each_lean_part_gives_rfdetrs_loss_and_gradients",
    "decoder_relu_in_the_product": "tests/test_decoder_layer.py::test_each_lean_part_gives_rfdetrs_loss_and_gradients",
    "decoder_relu_mask_in_the_product": "tests/test_decoder_relu_mask_in_the_product.py::"
    "test_in_tritons_interpreter_a_nano_training_step_gives_rfdetrs_loss_and_gradients",
    "sine_embedding_in_one_stack": "tests/test_sine_embedding_in_one_stack.py::"
    "test_the_step_embeds_in_one_stack_and_gives_rfdetrs_loss_and_gradients",
    "two_stage_ranking_without_autograd": "tests/test_two_stage_ranking.py::"
    "test_the_step_gives_rfdetrs_loss_gradients_and_proposals",
    "group_products_aligned_without_bias_copy": "tests/test_group_products_aligned_without_bias_copy.py::"
    "test_the_step_gives_rfdetrs_loss_gradients_and_proposals_without_baddbmm",
    "padding_in_one_copy": "tests/test_padding_in_one_copy.py::test_the_padding_equals_pad_sequences",
    "cost_padding_in_one_gather": "tests/test_cost_padding_in_one_gather.py::"
    "test_the_padded_batch_is_rfdetrs_element_for_element",
    "metric_update_per_batch": "tests/test_metric_update_per_batch.py::"
    "test_the_metrics_state_and_result_equal_rfdetrs_bit_for_bit",
    "metric_inputs_in_one_copy": "tests/test_validation_metrics.py::"
    "test_validation_metrics_equal_rfdetrs_with_the_validation_speedups",
    "matching_in_workers": "tests/test_validation_metrics.py::"
    "test_matching_in_workers_gives_rfdetrs_accumulator_array_for_array",
    "evaluation_on_every_core": "tests/test_evaluation_on_every_core.py::"
    "test_the_evaluation_gets_every_core_and_gives_rfdetrs_metrics",
    "eager_validation": "tests/test_eager_validation.py::"
    "test_validation_runs_the_compiled_models_module_without_compiling_it",
    "checkpoints_in_background": "tests/test_checkpoints_in_background.py::"
    "test_the_file_holds_the_checkpoint_as_it_was_when_saved",
    "static_cuda_graphs": "tests/test_gpu.py::test_the_h200_row_as_a_user_gets_it_captures_and_replays_cuda_graphs",
    "gc_freeze": "tests/test_gc_freeze.py::"
    "test_training_freezes_after_the_first_steps_and_the_epoch_log_counts_full_collections",
    "next_epoch_during_validation": "tests/test_next_epoch_during_validation.py::"
    "test_the_next_epochs_first_batch_is_ready_when_validation_ends_and_the_batches_are_the_same",
    "validation_loader_ahead": "tests/test_validation_loader_ahead.py::"
    "test_the_validation_batches_are_on_their_way_before_validation_starts_and_are_the_same",
}


def test_the_registry_names_each_speedup_once_with_a_test_that_exists():
    assert len(NAMES) == len(set(NAMES)) == 36
    assert set(SPEEDUP_TESTS) == set(NAMES)
    for speedup in SPEEDUPS:
        file, _, test = SPEEDUP_TESTS[speedup.name].partition("::")
        assert re.search(rf"^def {test}\(", (REPO / file).read_text(), re.MULTILINE), SPEEDUP_TESTS[speedup.name]
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
    assert select_speedups("auto", CHECKED_RFDETR, missing=()).names() == list(BY_DEFAULT)
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
    # in the registry's order
    expected = list(BY_DEFAULT) if setting == "all" else ["deformable_sampling", "gc_freeze"]
    assert select_speedups(setting, CHECKED_RFDETR, missing=()).names() == expected


def test_without_triton_auto_leaves_the_triton_speedups_off_and_all_refuses(monkeypatch):
    needs_triton = [speedup.name for speedup in SPEEDUPS if "triton" in speedup.needs]
    assert needs_triton == [
        "normalization_in_one_kernel",
        "deformable_sampling",
        "backbone_norm_backward_in_one_pass",
        "decoder_relu_mask_in_the_product",
    ]
    monkeypatch.setitem(sys.modules, "triton", None)  # as in a Python where triton does not import
    auto = select_speedups("auto", CHECKED_RFDETR)
    assert auto.names() == [name for name in BY_DEFAULT if name not in needs_triton]
    for name in needs_triton:
        assert f"Speedup left off: {name}: needs triton, which this Python cannot import" in auto.report()
    for setting in ("all", ["gc_freeze", "deformable_sampling"]):
        with pytest.raises(
            SpeedupError, match=r"deformable_sampling: needs triton.*pip install triton.*speedups: auto"
        ):
            select_speedups(setting, CHECKED_RFDETR)
    assert select_speedups(["gc_freeze"], CHECKED_RFDETR).names() == ["gc_freeze"]
    # where triton imports, all and a list naming deformable_sampling apply it
    assert select_speedups("all", CHECKED_RFDETR, missing=()).names() == list(BY_DEFAULT)
    assert select_speedups(["deformable_sampling"], CHECKED_RFDETR, missing=()).names() == ["deformable_sampling"]


def test_on_the_cpu_auto_leaves_the_gpu_only_speedups_off_and_all_applies_them():
    gpu_only = [speedup.name for speedup in SPEEDUPS if speedup.gpu_only]
    assert "matching_in_workers" in gpu_only
    on_cpu = select_speedups("auto", CHECKED_RFDETR, missing=(), device_kind="cpu")
    assert on_cpu.names() == [name for name in BY_DEFAULT if name not in gpu_only]
    for name in gpu_only:
        assert (
            f"Speedup left off: {name}: gains only when training runs on a GPU (train.device: cpu)" in on_cpu.report()
        )
    assert select_speedups("auto", CHECKED_RFDETR, missing=(), device_kind="cuda").names() == list(BY_DEFAULT)
    # asked for by name, or with all, they apply on the CPU too: they compute rfdetr's values there as well
    assert select_speedups("all", CHECKED_RFDETR, missing=(), device_kind="cpu").names() == list(BY_DEFAULT)
    assert select_speedups(gpu_only, CHECKED_RFDETR, missing=(), device_kind="cpu").names() == gpu_only


def test_a_speedup_only_when_named_applies_only_where_a_list_names_it_and_auto_and_all_say_why():
    # resize_in_torch: its values are not rfdetr's; backbone_maps_in_one_buffer: its gain is not yet measured
    only_when_named = ["resize_in_torch", "backbone_maps_in_one_buffer"]
    assert [speedup.name for speedup in SPEEDUPS if speedup.only_when_named] == only_when_named
    assert set(NAMES) - set(BY_DEFAULT) == set(only_when_named)
    for setting in ("auto", "all"):
        selection = select_speedups(setting, CHECKED_RFDETR, missing=())
        assert not set(only_when_named) & set(selection.names())
        assert (
            "Speedup left off: resize_in_torch: not rfdetr's values (torch's resize rounds differently from Pillow's: "
            "pixels differ by up to 2 levels of 255): applies only where train.speedups names it" in selection.report()
        )
        assert (
            "Speedup left off: backbone_maps_in_one_buffer: its gain in the train stage is not yet measured: applies "
            "only where train.speedups names it" in selection.report()
        )
    named = select_speedups(["images_as_bytes", "resize_in_torch"], CHECKED_RFDETR, missing=())
    assert named.names() == ["images_as_bytes", "resize_in_torch"]
    # all in a list: every speedup all applies, and the ones named beside it
    every_and_named = select_speedups(["all", *only_when_named], CHECKED_RFDETR, missing=())
    assert every_and_named.names() == list(NAMES) and every_and_named.left_off == ()
    with pytest.raises(SpeedupError, match=r"asks for every speedup, resize_in_torch, .* rfdetr 1\.12\.0"):
        select_speedups(["all", "resize_in_torch"], "1.12.0")
    assert "**Only when named:** not rfdetr's values (torch's resize rounds differently" in markdown_table()


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
    assert package_version("rfdetr") == CHECKED_RFDETR


def test_every_target_of_every_hook_is_as_checked_in_the_installed_packages():
    assert gate([*SPEEDUPS, *HOOKS]) == {}
    assert set(CHECKED) <= set(all_targets())  # no digest recorded for a target no hook declares
    assert len(CHECKED) >= len(all_targets()) - 6  # only constants and torch's own functions go without one


def changed(monkeypatch, path: str) -> None:
    """The installed package as a release that rewrote the function at `path` would leave it: same behaviour, other
    source."""
    owner, name = owner_and_name(path)
    original = getattr(owner, name)

    def rewritten(*args, **kwargs):  # a release's new version of it
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, rewritten)


def test_a_speedup_whose_target_changed_stays_off_with_auto_and_is_refused_by_name(monkeypatch):
    changed(monkeypatch, "rfdetr.utilities.tensors:PackedTargets.to_list")
    auto = select_speedups("auto", CHECKED_RFDETR, missing=())
    assert "targets_one_copy" not in auto.names() and len(auto.names()) == len(BY_DEFAULT) - 1
    (line,) = [line for line in auto.report() if "targets_one_copy" in line]
    assert line.startswith(
        "Speedup left off: targets_one_copy: rfdetr.utilities.tensors:PackedTargets.to_list changed since it was "
        "checked (source digest "
    )
    with pytest.raises(SpeedupError, match=r"targets_one_copy: rfdetr\.utilities.*changed.*train\.speedups: auto"):
        select_speedups(["targets_one_copy", "gc_freeze"], CHECKED_RFDETR, missing=())


def test_a_missing_target_keeps_its_hook_off_and_the_log_says_what_runs_instead(monkeypatch, caplog):
    import rfdetr.training.callbacks.coco_eval as coco_eval

    monkeypatch.delattr(coco_eval.COCOEvalCallback, "_compute_map_metric")
    with caplog.at_level(logging.INFO):
        off = check_hooks()
    assert list(off) == ["coco_metrics"] and "is missing from the installed packages" in off["coco_metrics"]
    assert (
        "Hook coco_metrics is off: rfdetr.training.callbacks.coco_eval:COCOEvalCallback._compute_map_metric is "
        "missing from the installed packages. Instead: the evaluate stage reports what rfdetr's evaluate() returns"
    ) in caplog.text


def test_the_trainer_plugins_hook_replaces_build_trainer_inside_the_block_only():
    import rfdetr.training

    original = rfdetr.training.build_trainer
    with trainer_plugins([]):
        assert rfdetr.training.build_trainer is original  # no plugins: nothing to replace
    with trainer_plugins(["a plugin"]):
        assert rfdetr.training.build_trainer is not original
    assert rfdetr.training.build_trainer is original


def test_the_workflows_callbacks_reach_the_trainers_lightning_builds_inside_their_block_only():
    """Through Lightning's callbacks_factory entry point, which this package's install registers."""
    import pytorch_lightning as pl

    marker = pl.Callback()
    with attached([marker]):
        assert active_callbacks() == [marker]
        assert marker in pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False).callbacks
    assert active_callbacks() == []
    assert marker not in pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False).callbacks


def test_the_fp8_validation_hook_wraps_rfdetrs_validation_step_inside_the_block_only():
    from rfdetr.training.module_model import RFDETRModelModule

    from rfdetr_coco_pipeline.hooks.fp8_validation import validation_of_any_size

    original = RFDETRModelModule.validation_step
    with validation_of_any_size(2):
        assert RFDETRModelModule.validation_step is not original
    assert RFDETRModelModule.validation_step is original


def test_the_docs_show_the_registry():
    speedups = (REPO / "docs" / "speedups.md").read_text()
    for table in (markdown_table(), hooks_table()):
        assert table in speedups, "paste `python -m rfdetr_coco_pipeline.hooks` into docs/speedups.md"


@pytest.mark.slow
def test_with_another_rfdetr_auto_trains_with_stock_rfdetr_and_the_log_lists_what_was_left_off(
    tiny_dataset, tmp_path, caplog, monkeypatch
):
    """The train stage given the installed rfdetr's version as "1.12.0": one real epoch of rfdetr on the CPU."""
    from rfdetr_coco_pipeline.common import read_json, write_json
    from rfdetr_coco_pipeline.training.block import BlockJob, train_block

    for cache in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_FX_GRAPH_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
    ):
        monkeypatch.setenv(cache, str(tmp_path / "cache"))  # restored after the test
    config = base_config()
    config["results_dir"] = str(tmp_path / "results")
    settings = settings_of(config, epochs=1, resolution=64, device="cpu", max_workers=0, speedups="auto")
    write_json(tmp_path / "stage.json", {"path": str(tiny_dataset), "where": "disk"})
    job = BlockJob("block_01", tmp_path / "stage.json", None, tmp_path / "block_01", 2)
    with caplog.at_level(logging.INFO):
        train_block(settings, job, "1.12.0")
    run = read_json(tmp_path / "block_01" / "run.json")
    assert run["speedups"] == [] and run["recipe"]["rfdetr"] == "1.12.0"
    assert (tmp_path / "block_01" / "checkpoint.ckpt").is_file()
    assert f"Speedups applied (0 of {len(NAMES)}): none" in caplog.text
    for name in NAMES:
        assert f"Speedup left off: {name}: checked against rfdetr {CHECKED_RFDETR}, but rfdetr 1.12.0" in caplog.text

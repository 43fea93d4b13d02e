"""The workflow's extensions of rfdetr, with the one registry of its speedups.

Two kinds of code live in this package:

- **Speedups** (`SPEEDUPS`, below). Each computes rfdetr's values with less host work, fewer waits for the GPU or
  faster kernels; each names what it replaces and the test that shows it gives rfdetr's values. Patches
  (`patches/`) replace private functions or methods of rfdetr (or of Lightning, where rfdetr goes through it)
  inside a `with` block; callbacks (`callbacks/`) are Lightning callbacks added to rfdetr's Trainer. The train
  stage applies what `train.speedups` selects (`select_speedups`, then `applied`); `bench.profile_steps
  --speedups` and the tests read the same registry.
- **The workflow's hooks into rfdetr's training**, used with or without speedups: `trainer_hook.extra_callbacks`
  (callbacks and plugins on the Trainer that rfdetr's `train()` builds), `callbacks.block_end.StopAtBlockEnd`,
  `callbacks.epoch_log.EpochLog`, and on the FP8 route `fp8_validation.validation_of_any_size`.

The speedups were checked against rfdetr `CHECKED_RFDETR` only: they reach into private parts that another release
may change. `select_speedups` is the one place that decides, from the installed version, what is applied.

`python -m rfdetr_extensions` prints the registry as the Markdown table in README.md
(`tests/test_rfdetr_extensions.py::test_the_readme_shows_the_registry` checks that they agree).
"""

from __future__ import annotations

import importlib.util
import pkgutil
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

CHECKED_RFDETR = "1.11.2"


@dataclass(frozen=True)
class Speedup:
    """One registry entry.

    `entry` is "module:attribute": for kind "patch" a function that returns a context manager (taking the
    `SpeedupOptions` fields named in `options` as keyword arguments), for kind "callback" a Lightning callback class
    constructed without arguments. A patch's `replaces` entries are "module:attribute" or "module:Class.attribute"
    paths of what it swaps; a callback's say in words what it changes. `needs` names the modules it cannot work
    without: where one does not import, `select_speedups` leaves it off (`auto`) or refuses (`all`, a list).
    `gpu_only` marks one that gains nothing when training runs on the CPU: `auto` leaves it off there.
    """

    name: str
    kind: Literal["patch", "callback"]
    entry: str
    replaces: tuple[str, ...]
    effect: str
    test: str
    options: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    gpu_only: bool = False

    def load(self) -> Any:
        return pkgutil.resolve_name(self.entry)


def _patch(
    name: str,
    replaces: tuple[str, ...],
    effect: str,
    test: str,
    options: tuple[str, ...] = (),
    needs: tuple[str, ...] = (),
    gpu_only: bool = False,
) -> Speedup:
    entry = f"rfdetr_extensions.patches.{name}:{name}"
    return Speedup(name, "patch", entry, replaces, effect, test, options, needs, gpu_only)


def _callback(name: str, cls: str, replaces: str, effect: str, test: str) -> Speedup:
    return Speedup(name, "callback", f"rfdetr_extensions.callbacks.{name}:{cls}", (replaces,), effect, test)


SPEEDUPS: tuple[Speedup, ...] = (
    _patch(
        "targets_one_copy",
        ("rfdetr.utilities.tensors:PackedTargets.to_list",),
        "a batch's targets reach the GPU in one copy per field, not one per field and image",
        "tests/test_targets_one_copy.py::test_one_copy_per_field_gives_rfdetrs_targets",
    ),
    _patch(
        "matches_on_device",
        ("rfdetr.models._assignment:assign_many_bucketed",),
        "the matcher's indices reach the loss on the GPU in one copy that does not wait",
        "tests/test_matches_on_device.py::test_the_loss_is_the_same_with_and_without_the_extension_on_the_cpu",
    ),
    _patch(
        "matching_without_waiting",
        (
            "rfdetr.models.matcher:HungarianMatcher._match_many",
            "rfdetr.models.criterion:SetCriterion.num_boxes_for_targets",
        ),
        "the batched matching and the loss's box count are queued on the GPU without reading anything back",
        "tests/test_matching_without_waiting.py::test_the_loss_and_the_matches_are_rfdetrs",
    ),
    _patch(
        "target_counts_without_waiting",
        ("rfdetr.models.criterion:SetCriterion._get_batched_detection_losses",),
        "the batched loss's per-image target counts reach the GPU from pinned memory, without a copy that waits",
        "tests/test_target_counts_without_waiting.py::test_the_batched_losses_are_rfdetrs",
        gpu_only=True,  # rfdetr takes the batched loss path on CUDA only
    ),
    _patch(
        "gather_matched_targets",
        ("rfdetr.models.criterion:SetCriterion._get_matched_targets",),
        "the loss gathers each layer's matched targets in a few operations, not three per image",
        "tests/test_gather_matched_targets.py::test_each_layers_matched_targets_equal_rfdetrs",
    ),
    _patch(
        "ema_without_waiting",
        ("rfdetr.training.callbacks.ema:RFDETREMACallback._update_ema_for_step",),
        "the EMA update keeps its counter on the host instead of reading it from the GPU three times a step",
        "tests/test_ema_without_waiting.py::test_the_ema_weights_and_counter_equal_rfdetrs_over_many_steps",
    ),
    _patch(
        "lr_log_on_device",
        ("rfdetr.training.module_model:RFDETRModelModule._log_learning_rates",),
        "the learning rates are logged as tensors filled on the GPU, without a copy that waits",
        "tests/test_lr_log_on_device.py::test_the_same_values_names_and_settings_reach_lightning",
    ),
    _patch(
        "progress_bar_without_waiting",
        (
            "pytorch_lightning.trainer.connectors.logger_connector.result:_ResultCollection.metrics",
            "pytorch_lightning.trainer.connectors.logger_connector.result:convert_tensors_to_scalars",
        ),
        "the progress bar shows the newest loss and learning rate that reached the host, without waiting each step",
        "tests/test_progress_bar_without_waiting.py::test_on_the_cpu_the_bar_shows_lightnings_values",
        gpu_only=True,  # on the CPU nothing waits: the values are already on the host
    ),
    _patch(
        "nice_loader_workers",
        ("rfdetr.training.module_data:_worker_init_fn",),
        "the data-loader workers run train.loader_niceness below the training process",
        "tests/test_nice_loader_workers.py::test_workers_run_niced_and_load_the_same_items",
        options=("loader_niceness",),
    ),
    _patch(
        "images_as_bytes",
        (
            "rfdetr.datasets.coco:_route_transforms",
            "rfdetr.training.module_data:RFDETRDataModule.on_after_batch_transfer",
        ),
        "training images travel from the workers as uint8 and are normalised on the GPU, bit for bit",
        "tests/test_images_as_bytes.py::test_training_batches_travel_as_bytes_and_arrive_as_rfdetrs_floats",
    ),
    _patch(
        "validation_images_as_bytes",
        (
            "rfdetr.datasets.coco:_route_transforms",
            "rfdetr.training.module_data:RFDETRDataModule.on_after_batch_transfer",
        ),
        "validation images travel from the workers as uint8 and are normalised on the GPU, bit for bit",
        "tests/test_images_as_bytes.py::test_validation_batches_travel_as_bytes_and_arrive_as_rfdetrs_floats",
    ),
    _patch(
        "deformable_sampling",
        ("rfdetr.models.ops.functions.ms_deform_attn_func:_bilinear_grid_sample",),
        "the decoder's bilinear sampling runs as Triton kernels on CUDA (needs Triton)",
        "tests/test_deformable_sampling.py::test_in_tritons_interpreter_the_kernels_give_grid_samples_values_and_gradients",
        needs=("triton",),
    ),
    _patch(
        "padding_in_one_copy",
        ("rfdetr.models.matcher:pad_sequence",),
        "the matcher pads a batch's targets in two operations instead of one copy per image",
        "tests/test_padding_in_one_copy.py::test_the_padding_equals_pad_sequences",
    ),
    _patch(
        "metric_update_per_batch",
        (
            "rfdetr.training.callbacks.coco_eval:COCOEvalCallback._convert_targets",
            "rfdetr.training.coco_map:OnePassCocoMeanAveragePrecision.update",
        ),
        "a validation batch's boxes reach the COCO metric converted once per batch, not once per image",
        "tests/test_metric_update_per_batch.py::test_the_metrics_state_and_result_equal_rfdetrs_bit_for_bit",
    ),
    _patch(
        "metric_inputs_in_one_copy",
        (
            "rfdetr.training.callbacks.coco_eval:COCOEvalCallback._convert_preds",
            "rfdetr.training.callbacks.coco_eval:COCOEvalCallback._convert_targets",
            "rfdetr.training.coco_map:OnePassCocoMeanAveragePrecision.merge_distributed_state",
        ),
        "a validation batch's predictions and targets reach the COCO metric on the host in one copy per dtype",
        "tests/test_validation_metrics.py::test_validation_metrics_equal_rfdetrs_with_the_validation_speedups",
    ),
    _patch(
        "matching_in_workers",
        (
            "rfdetr.training.callbacks.coco_eval:build_matching_data",
            "rfdetr.training.callbacks.coco_eval:merge_matching_data",
            "rfdetr.training.callbacks.coco_eval:init_matching_accumulator",
            "rfdetr.training.callbacks.coco_eval:COCOEvalCallback._compute_and_log_f1_metrics",
        ),
        "validation's F1 matching runs in worker processes while the next batch goes on; merged in batch order",
        "tests/test_validation_metrics.py::test_matching_in_workers_gives_rfdetrs_accumulator_array_for_array",
        # on the CPU the training process is the one computing, so handing matching to workers only adds their start
        gpu_only=True,
    ),
    _patch(
        "evaluation_on_every_core",
        ("rfdetr.training.coco_map:_vernier_thread_budget",),
        "the COCO evaluation at each validation's end runs on every core of the rank, not on torch's one thread",
        "tests/test_evaluation_on_every_core.py::test_the_evaluation_gets_every_core_and_gives_rfdetrs_metrics",
        gpu_only=True,  # on the CPU torch's threads, and so rfdetr's budget, are every core already
    ),
    _patch(
        "eager_validation",
        ("rfdetr.training.module_model:RFDETRModelModule._resolve_eval_model",),
        "validation runs the model uncompiled: no eval-graph compile at each job's first validation",
        "tests/test_eager_validation.py::test_validation_runs_the_compiled_models_module_without_compiling_it",
        gpu_only=True,  # rfdetr compiles only on CUDA: on the CPU there is no wrapper to look through
    ),
    _patch(
        "checkpoints_in_background",
        ("rfdetr.training:build_trainer",),
        "each epoch's last.ckpt is written by a background thread (Lightning's AsyncCheckpointIO) as the next trains",
        "tests/test_checkpoints_in_background.py::test_the_file_holds_the_checkpoint_as_it_was_when_saved",
        # on the CPU the writer takes the cores the model computes on: epochs ran longer by what the wait saved
        gpu_only=True,
    ),
    _callback(
        "static_cuda_graphs",
        "StaticCudaGraphs",
        "rfdetr's compiled model: compiled again for the one training shape, replayed as CUDA graphs",
        "profiles with compile and cuda_graphs on: no dynamic-shape compile, CUDA graph replay, compiled losses",
        "tests/test_gpu.py::test_the_h200_row_as_a_user_gets_it_captures_and_replays_cuda_graphs",
    ),
    _callback(
        "gc_freeze",
        "FreezeAfterWarmup",
        "CPython's full garbage collections over the training process's long-lived objects",
        "after each epoch's first steps the process's objects are frozen, so full collections skip them",
        "tests/test_gc_freeze.py::test_training_freezes_after_the_first_steps_and_the_epoch_log_counts_full_collections",
    ),
    _callback(
        "next_epoch_during_validation",
        "NextEpochDuringValidation",
        "when the training loader's workers start on an epoch: during the previous validation, not after it",
        "the loader's workers decode the next epoch's first batches while the model validates",
        "tests/test_next_epoch_during_validation.py::"
        "test_the_next_epochs_first_batch_is_ready_when_validation_ends_and_the_batches_are_the_same",
    ),
    _callback(
        "validation_loader_ahead",
        "ValidationLoaderAhead",
        "when the validation loader's workers start: during the epoch's last training steps, not after them",
        "the loader's workers decode the first validation batches while the last training steps run",
        "tests/test_validation_loader_ahead.py::"
        "test_the_validation_batches_are_on_their_way_before_validation_starts_and_are_the_same",
    ),
)
NAMES: tuple[str, ...] = tuple(speedup.name for speedup in SPEEDUPS)
SETTINGS = ("auto", "all", "none")  # train.speedups: one of these, or a list of NAMES


class SpeedupError(RuntimeError):
    """train.speedups cannot be honoured; the message says why and what to do."""


@dataclass(frozen=True)
class SpeedupOptions:
    """Settings some speedups take (each `Speedup.options` names the ones its entry receives)."""

    loader_niceness: int = 0


@dataclass(frozen=True)
class Selection:
    """What `train.speedups` selected for the installed rfdetr: the speedups to apply, the others with a reason."""

    applied: tuple[Speedup, ...]
    left_off: tuple[tuple[Speedup, str], ...]

    def names(self) -> list[str]:
        return [speedup.name for speedup in self.applied]

    def report(self) -> list[str]:
        """Log lines: what is applied, then each speedup left off and why."""
        lines = [f"Speedups applied ({len(self.applied)} of {len(SPEEDUPS)}): {', '.join(self.names()) or 'none'}"]
        lines += [f"Speedup left off: {speedup.name}: {why}" for speedup, why in self.left_off]
        return lines


def missing_modules() -> frozenset[str]:
    """The modules some speedup `needs` that this interpreter cannot import (looked up without importing them)."""
    return frozenset(
        module for speedup in SPEEDUPS for module in speedup.needs if importlib.util.find_spec(module) is None
    )


def select_speedups(
    setting: str | Sequence[str],
    rfdetr_version: str,
    missing: Collection[str] | None = None,
    device_kind: str = "cuda",
) -> Selection:
    """The speedups `setting` (train.speedups) asks for, given the installed rfdetr's version, `missing`, the
    modules that do not import here (None: `missing_modules()`), and the device training runs on (`device_kind`:
    "cuda" or "cpu").

    `auto` applies every speedup with the rfdetr version they were checked against, and none with another (training
    is then stock rfdetr's); a speedup whose `needs` are missing (deformable_sampling without Triton), or a
    `gpu_only` one when training runs on the CPU, it leaves off, saying why. `all`, or a list of names, refuses
    another version, and a named speedup whose `needs` are missing, with `SpeedupError`: it trains with every
    speedup it asks for or not at all (a `gpu_only` one applies on the CPU too). `none` applies nothing. Shown by
    `tests/test_rfdetr_extensions.py::test_auto_applies_everything_with_the_checked_rfdetr_and_nothing_with_another_saying_why`,
    `tests/test_rfdetr_extensions.py::test_asking_for_speedups_by_name_or_all_refuses_another_rfdetr_with_what_to_do`,
    `tests/test_rfdetr_extensions.py::test_without_triton_auto_leaves_deformable_sampling_off_and_all_refuses`,
    `tests/test_rfdetr_extensions.py::test_none_applies_nothing_and_unknown_names_are_refused`,
    `tests/test_rfdetr_extensions.py::test_on_the_cpu_auto_leaves_the_gpu_only_speedups_off_and_all_applies_them`.
    """
    if isinstance(setting, str) and setting not in SETTINGS:
        raise SpeedupError(f"train.speedups: {setting!r} is not one of {', '.join(SETTINGS)} or a list of names")
    wanted = list(NAMES) if setting in ("auto", "all") else [] if setting == "none" else list(setting)
    unknown = [name for name in wanted if name not in NAMES]
    if unknown:
        raise SpeedupError(f"train.speedups: unknown speedup(s) {', '.join(unknown)} (known: {', '.join(NAMES)})")
    asked = "every speedup" if setting == "all" else ", ".join(wanted)
    if wanted and rfdetr_version != CHECKED_RFDETR:
        if setting != "auto":
            raise SpeedupError(
                f"train.speedups asks for {asked}, which were checked against rfdetr {CHECKED_RFDETR}, but rfdetr "
                f"{rfdetr_version} is installed. Install rfdetr=={CHECKED_RFDETR} (pip install -e . does), or set "
                "train.speedups: auto to train with stock rfdetr."
            )
        reason = f"checked against rfdetr {CHECKED_RFDETR}, but rfdetr {rfdetr_version} is installed"
        return Selection((), tuple((speedup, reason) for speedup in SPEEDUPS))
    missing = missing_modules() if missing is None else frozenset(missing)
    absent = {
        speedup.name: [module for module in speedup.needs if module in missing]
        for speedup in SPEEDUPS
        if speedup.name in wanted and missing.intersection(speedup.needs)
    }
    lacking = {name: f"needs {', '.join(modules)}, which this Python cannot import" for name, modules in absent.items()}
    if setting == "auto" and device_kind != "cuda":
        lacking |= {
            speedup.name: "gains only when training runs on a GPU (train.device: cpu)"
            for speedup in SPEEDUPS
            if speedup.gpu_only and speedup.name not in lacking
        }
    if lacking and setting != "auto":
        modules = sorted({module for found in absent.values() for module in found})
        raise SpeedupError(
            f"train.speedups asks for {asked}, but {'; '.join(f'{name} {why}' for name, why in lacking.items())}. "
            f"Install it (pip install {' '.join(modules)}), or set train.speedups: auto, which leaves "
            f"{', '.join(lacking)} off and says so in the log."
        )
    why_off = "train.speedups: none" if setting == "none" else "not named in train.speedups"
    return Selection(
        tuple(speedup for speedup in SPEEDUPS if speedup.name in wanted and speedup.name not in lacking),
        tuple(
            (speedup, lacking.get(speedup.name, why_off))
            for speedup in SPEEDUPS
            if speedup.name not in wanted or speedup.name in lacking
        ),
    )


@contextmanager
def applied(selection: Selection, options: SpeedupOptions | None = None) -> Iterator[list[Any]]:
    """Within this block the selected patches are in place; yields the selected callbacks, to add to the Trainer.

    Afterwards rfdetr's own code is back, also after an error. Shown by
    `tests/test_rfdetr_extensions.py::test_rfdetrs_code_is_replaced_inside_the_block_and_restored_after` and
    `tests/test_rfdetr_extensions.py::test_every_speedup_can_be_applied_alone`.
    """
    options = options or SpeedupOptions()
    callbacks: list[Any] = []
    with ExitStack() as patches:
        for speedup in selection.applied:
            entry = speedup.load()
            if speedup.kind == "callback":
                callbacks.append(entry())
            else:
                patches.enter_context(entry(**{name: getattr(options, name) for name in speedup.options}))
        yield callbacks


def markdown_table() -> str:
    """The registry as README.md shows it."""
    rows = ["| speedup | what it does | replaces | test that shows rfdetr's values |", "| --- | --- | --- | --- |"]
    for speedup in SPEEDUPS:
        replaces = "<br>".join(f"`{what}`" if speedup.kind == "patch" else what for what in speedup.replaces)
        rows.append(f"| `{speedup.name}` | {speedup.effect} | {replaces} | `{speedup.test}` |")
    return "\n".join(rows)

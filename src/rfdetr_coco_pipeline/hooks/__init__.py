"""The one registry of the workflow's hooks into rfdetr's and Lightning's private code, and the gate they pass.

Two kinds of hook are declared here, each with the private names it replaces or reads (its targets):

- **Speedups** (`SPEEDUPS`), selected by `train.speedups`. Each computes rfdetr's own values with less host work,
  fewer waits for the GPU or faster kernels. Patches (`patches/`) replace a private function or method inside a
  `with` block; callbacks (`callbacks/`) are Lightning callbacks added to rfdetr's Trainer.
- **Hooks the workflow always uses** (`HOOKS`): the evaluation's full COCO result, the FP8 route's odd validation
  batch, the Trainer plugins (durable checkpoints; Lightning starting the DDP ranks inside one SLURM job), and every
  rank stopping at one step on SIGTERM.

The gate: before a stage uses a hook, every target is looked up in the installed packages and its source compared
with the one the hook was checked against (`checked_sources.CHECKED`). A hook whose target is missing or changed
stays off and the log says which and why: a speedup is left off (training is then rfdetr's own), an always-on hook
falls back to rfdetr's own code as its `fallback` says. Speedups are also held to the rfdetr release they were
checked against (`CHECKED_RFDETR`), since they rely on more of its behaviour than the targets' source.

`python -m rfdetr_coco_pipeline.hooks` prints the tables of docs/speedups.md;
`python -m rfdetr_coco_pipeline.hooks --sources` prints the installed targets' source digests, to record after
checking the hooks against a new release.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import pkgutil
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from rfdetr_coco_pipeline.common import StageError

log = logging.getLogger(__name__)

CHECKED_RFDETR = "1.11.2"


@dataclass(frozen=True)
class Hook:
    """An always-on hook: `entry` ("module:attribute") is what the workflow uses, `targets` the private names of
    rfdetr or Lightning ("module:attribute" or "module:Class.attribute") it replaces or reads, and `fallback` what
    runs when the gate keeps it off."""

    name: str
    entry: str
    targets: tuple[str, ...]
    purpose: str
    fallback: str


@dataclass(frozen=True)
class Speedup:
    """A speedup. `entry` is "module:attribute": for kind "patch" a function that returns a context manager (taking
    the `train` settings named in `options` as keyword arguments), for kind "callback" a Lightning callback class
    constructed without arguments. `replaces` says what it swaps: for a patch the private names, for a callback in
    words. `reads` lists further private names it relies on. `needs` names the modules it cannot work without;
    `gpu_only` marks one that gains nothing when training runs on the CPU. Each has a test that shows it gives
    rfdetr's values (the tests' `SPEEDUP_TESTS` names it), or, for one whose values are not rfdetr's, how far they
    move. `only_when_named` says why `auto` and `all` leave one off, which then applies only where train.speedups
    names it: its values are not rfdetr's, or its gain in the train stage is not yet measured."""

    name: str
    kind: Literal["patch", "callback"]
    entry: str
    replaces: tuple[str, ...]
    effect: str
    reads: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    gpu_only: bool = False
    only_when_named: str = ""

    @property
    def targets(self) -> tuple[str, ...]:
        return (*(self.replaces if self.kind == "patch" else ()), *self.reads)

    def load(self) -> Any:
        return pkgutil.resolve_name(self.entry)


def _patch(
    name: str,
    replaces: tuple[str, ...],
    effect: str,
    reads: tuple[str, ...] = (),
    options: tuple[str, ...] = (),
    needs: tuple[str, ...] = (),
    gpu_only: bool = False,
    only_when_named: str = "",
) -> Speedup:
    entry = f"rfdetr_coco_pipeline.hooks.patches.{name}:{name}"
    return Speedup(name, "patch", entry, replaces, effect, reads, options, needs, gpu_only, only_when_named)


def _callback(name: str, cls: str, replaces: str, effect: str, reads: tuple[str, ...] = ()) -> Speedup:
    entry = f"rfdetr_coco_pipeline.hooks.callbacks.{name}:{cls}"
    return Speedup(name, "callback", entry, (replaces,), effect, reads)


CRITERION = "rfdetr.models.criterion:SetCriterion"
COCO_EVAL = "rfdetr.training.callbacks.coco_eval"
COCO_MAP = "rfdetr.training.coco_map"
MODULE = "rfdetr.training.module_model:RFDETRModelModule"
DATA_MODULE = "rfdetr.training.module_data:RFDETRDataModule"
# rfdetr's train() looks this up when it is called: wrapping it reaches the Trainer train() builds
BUILD_TRAINER = ("rfdetr.training:build_trainer", "rfdetr.detr:RFDETR.train")
SAMPLER_EPOCH = "lightning_fabric.utilities.data:_set_sampler_epoch"
SIGNAL_CONNECTOR = "pytorch_lightning.trainer.connectors.signal_connector:_SignalConnector"
EPOCH_LOOP = "pytorch_lightning.loops.training_epoch_loop:_TrainingEpochLoop"
BACKBONE = "rfdetr.models.backbone.dinov2_with_windowed_attn"
PATCH_EMBEDDINGS = f"{BACKBONE}:Dinov2WithRegistersPatchEmbeddings"
BACKBONE_LAYER = f"{BACKBONE}:WindowedDinov2WithRegistersLayer"
TRANSFORMER = "rfdetr.models.transformer"
DECODER_LAYER_FORWARD = f"{TRANSFORMER}:TransformerDecoderLayer.forward_post"
# the layer's attributes the lean forward uses, and the function that names its activation
DECODER_LAYER_READS = (
    f"{TRANSFORMER}:TransformerDecoderLayer.__init__",
    f"{TRANSFORMER}:_get_activation_fn",
)

SPEEDUPS: tuple[Speedup, ...] = (
    _patch(
        "targets_one_copy",
        ("rfdetr.utilities.tensors:PackedTargets.to_list",),
        "a batch's targets reach the GPU in one copy per field, not one per field and image",
        reads=("rfdetr.utilities.tensors:PackedTargets.__init__",),
    ),
    _patch(
        "matches_on_device",
        ("rfdetr.models._assignment:assign_many_bucketed",),
        "the matcher's indices reach the loss on the GPU in one copy that does not wait",
    ),
    _patch(
        "matching_without_waiting",
        ("rfdetr.models.matcher:HungarianMatcher._match_many", f"{CRITERION}.num_boxes_for_targets"),
        "the batched matching and the loss's box count are queued on the GPU without reading anything back",
        reads=(
            "rfdetr.models.matcher:_SANITIZED_COST_MARGIN",
            "rfdetr.models.matcher:HungarianMatcher._compact_path_applicable",
            "rfdetr.models.matcher:HungarianMatcher._sanitize_cost_matrix",
            "rfdetr.models._assignment:_stack_padded",
            "rfdetr.models._assignment:_assign_padded",
            "torch_linear_assignment.assignment:_cuda_uses_triton",  # torch-hungarian, pinned by rfdetr
        ),
    ),
    _patch(
        "target_counts_without_waiting",
        (f"{CRITERION}._get_batched_detection_losses",),
        "the batched loss's per-image target counts reach the GPU from pinned memory, without a copy that waits",
        gpu_only=True,  # rfdetr takes the batched loss path on CUDA only
    ),
    _patch(
        "gather_matched_targets",
        (f"{CRITERION}._get_matched_targets",),
        "the loss gathers each layer's matched targets in a few operations, not three per image",
        reads=("rfdetr.models.criterion:_MatchedTargets",),
    ),
    _patch(
        "ema_without_waiting",
        ("rfdetr.training.callbacks.ema:RFDETREMACallback._update_ema_for_step",),
        "the EMA update keeps its counter on the host instead of reading it from the GPU three times a step",
        reads=(
            "rfdetr.training.callbacks.ema:RFDETREMACallback.__init__",
            "rfdetr.training.callbacks.ema:RFDETREMACallback.on_fit_start",
            "rfdetr.training.callbacks.ema:RFDETREMACallback._multi_avg_fn",
        ),
    ),
    _patch(
        "lr_log_on_device",
        (f"{MODULE}._log_learning_rates",),
        "the learning rates are logged as tensors filled on the GPU, without a copy that waits",
        reads=("pytorch_lightning.trainer.connectors.logger_connector.result:_get_default_dtype",),
    ),
    _patch(
        "progress_bar_without_waiting",
        (
            "pytorch_lightning.trainer.connectors.logger_connector.result:_ResultCollection.metrics",
            "pytorch_lightning.trainer.connectors.logger_connector.result:convert_tensors_to_scalars",
        ),
        "the progress bar shows the newest loss and learning rate that reached the host, without waiting each step",
        gpu_only=True,  # on the CPU nothing waits: the values are already on the host
    ),
    _patch(
        "nice_loader_workers",
        ("rfdetr.training.module_data:_worker_init_fn",),
        "the data-loader workers run train.loader_niceness below the training process",
        options=("loader_niceness",),
    ),
    _patch(
        "images_as_bytes",
        ("rfdetr.datasets.coco:_route_transforms", f"{DATA_MODULE}.on_after_batch_transfer"),
        "training images travel from the workers as uint8 and are normalised on the GPU, bit for bit",
        reads=("rfdetr.datasets.transforms:Normalize.__init__",),
    ),
    _patch(
        "batch_copy_beside_the_step",
        (f"{DATA_MODULE}.transfer_batch_to_device",),
        "a batch's images reach the GPU on a CUDA stream of their own, beside the previous step's work, not after it "
        "on the step's stream",
        reads=("rfdetr.utilities.tensors:NestedTensor.__init__",),
        gpu_only=True,  # on the CPU there is no copy to overlap
    ),
    _patch(
        "validation_images_as_bytes",
        ("rfdetr.datasets.coco:_route_transforms", f"{DATA_MODULE}.on_after_batch_transfer"),
        "validation images travel from the workers as uint8 and are normalised on the GPU, bit for bit",
        reads=("rfdetr.datasets.transforms:Normalize.__init__",),
    ),
    _patch(
        "normalization_in_one_kernel",
        (),  # it changes the conversion images_as_bytes and validation_images_as_bytes add, none of rfdetr's code
        "where images_as_bytes or validation_images_as_bytes is on, the GPU makes the batch's normalised floats from "
        "its bytes in one Triton kernel, not five passes of PyTorch's, bit for bit",
        reads=(f"{DATA_MODULE}.on_after_batch_transfer",),
        needs=("triton",),
        gpu_only=True,  # its kernel runs on CUDA only (the tests run it in Triton's interpreter)
    ),
    _patch(
        "resize_in_torch",
        ("rfdetr.datasets.coco:_route_transforms",),
        "training images are resized, cropped and flipped as uint8 tensors by torchvision, not as Pillow images",
        only_when_named="not rfdetr's values (torch's resize rounds differently from Pillow's: pixels differ by up "
        "to 2 levels of 255)",
    ),
    _patch(
        "deformable_sampling",
        ("rfdetr.models.ops.functions.ms_deform_attn_func:_bilinear_grid_sample",),
        "the decoder's bilinear sampling runs as Triton kernels on CUDA (needs Triton)",
        needs=("triton",),
    ),
    _patch(
        "patch_embedding_as_product",
        (f"{PATCH_EMBEDDINGS}.forward",),
        "in training the backbone embeds the images' 16 x 16 patches with one matrix product, not a convolution",
        reads=(f"{PATCH_EMBEDDINGS}.__init__",),
    ),
    _patch(
        "backbone_norm_backward_in_one_pass",
        (f"{BACKBONE}:WindowedDinov2WithRegistersEncoder.forward",),
        "in training each residual sum of the backbone that a LayerNorm follows goes backward with it in one Triton "
        "kernel that also sums their parameters' gradients",
        # the encoder's loop runs the layers' steps as rfdetr's layer does
        reads=(
            f"{BACKBONE_LAYER}.forward",
            f"{BACKBONE_LAYER}.__init__",
            f"{BACKBONE}:Dinov2WithRegistersLayerScale.__init__",
            f"{BACKBONE}:WindowedDinov2WithRegistersEncoder.__init__",
        ),
        needs=("triton",),
        gpu_only=True,  # its kernel runs on CUDA only (the tests run it in Triton's interpreter)
    ),
    _patch(
        "backbone_maps_in_one_buffer",
        (f"{BACKBONE}:WindowedDinov2WithRegistersBackbone.forward",),
        "in training the backbone's four feature maps are channel slices of one channels-last buffer, laid out as "
        "their gradients come back, so the compiled backward does not copy those into contiguous tensors first",
        reads=(f"{BACKBONE}:WindowedDinov2WithRegistersBackbone.__init__",),
        only_when_named="its gain in the train stage is not yet measured",
    ),
    _patch(
        "decoder_attention_on_views",
        (DECODER_LAYER_FORWARD,),
        "in training the decoder's grouped self-attention works on views of the queries: no regrouping copies",
        reads=DECODER_LAYER_READS,
    ),
    _patch(
        "decoder_relu_in_the_product",
        (DECODER_LAYER_FORWARD,),
        "in training the decoder's first feed-forward product adds its bias and ReLU in cuBLASLt's epilogue, and its "
        "backward gives the bias's gradient from the weight's gradient product",
        reads=DECODER_LAYER_READS,
    ),
    _patch(
        "decoder_relu_mask_in_the_product",
        (DECODER_LAYER_FORWARD,),
        "in training, where decoder_relu_in_the_product is on, the decoder's feed-forward backward applies ReLU's mask "
        "in the Triton product that makes the gradient it masks, not in a pass of its own (needs Triton)",
        reads=DECODER_LAYER_READS,
        needs=("triton",),
        gpu_only=True,  # its kernel runs on CUDA only (the tests run it in Triton's interpreter)
    ),
    _patch(
        "sine_embedding_in_one_stack",
        (f"{TRANSFORMER}:gen_sineembed_for_position",),
        "the decoder's sine embedding of its reference boxes is one stack of the sines and cosines of every "
        "coordinate's angles, not a stack per coordinate joined by a concatenation",
        gpu_only=True,  # the concatenation costs more only in the kernel Inductor fuses it into
    ),
    _patch(
        "two_stage_ranking_without_autograd",
        (f"{TRANSFORMER}:Transformer._two_stage_group_selection",),
        "in training the two-stage proposals are ranked without autograd and only the selected rows computed with it",
        reads=(
            f"{TRANSFORMER}:_stack_linear_params",
            f"{TRANSFORMER}:_batched_group_linear",
            f"{TRANSFORMER}:_batched_group_layer_norm",
        ),
    ),
    _patch(
        "group_products_aligned_without_bias_copy",
        (f"{TRANSFORMER}:_batched_group_linear",),
        "in training the two-stage selection's group products compute a multiple of 8 outputs (96 classes, 8 box "
        "numbers) and add their bias in the kernel that reads them, instead of copying it into their output first",
        gpu_only=True,  # the addition fuses into the next kernel only when compiled
    ),
    _patch(
        "padding_in_one_copy",
        ("rfdetr.models.matcher:pad_sequence",),
        "the matcher pads a batch's targets in two operations instead of one copy per image",
        reads=("rfdetr.models.matcher:HungarianMatcher._compute_compact_detection_cost_matrix",),
    ),
    _patch(
        "cost_padding_in_one_gather",
        ("rfdetr.models._assignment:_stack_padded",),
        "the matcher pads its batch of cost matrices with one indexed read, not one copy per layer and image",
    ),
    _patch(
        "metric_update_per_batch",
        (f"{COCO_EVAL}:COCOEvalCallback._convert_targets", f"{COCO_MAP}:OnePassCocoMeanAveragePrecision.update"),
        "a validation batch's boxes reach the COCO metric converted once per batch, not once per image",
        reads=(f"{COCO_MAP}:_METRIC_INPUT_FIELDS",),
    ),
    _patch(
        "metric_inputs_in_one_copy",
        (
            f"{COCO_EVAL}:COCOEvalCallback._convert_preds",
            f"{COCO_EVAL}:COCOEvalCallback._convert_targets",
            f"{COCO_MAP}:OnePassCocoMeanAveragePrecision.merge_distributed_state",
        ),
        "a validation batch's predictions and targets reach the COCO metric on the host in one copy per dtype",
        reads=(f"{COCO_MAP}:_MAP_STATE_ATTRS",),
    ),
    _patch(
        "matching_in_workers",
        (
            f"{COCO_EVAL}:build_matching_data",
            f"{COCO_EVAL}:merge_matching_data",
            f"{COCO_EVAL}:init_matching_accumulator",
            f"{COCO_EVAL}:COCOEvalCallback._compute_and_log_f1_metrics",
        ),
        "validation's F1 matching runs in worker processes while the next batch goes on; merged in batch order",
        # on the CPU the training process is the one computing, so handing matching to workers only adds their start
        gpu_only=True,
    ),
    _patch(
        "evaluation_on_every_core",
        (f"{COCO_MAP}:_vernier_thread_budget",),
        "the COCO evaluation at each validation's end runs on every core of the rank, not on torch's one thread",
        gpu_only=True,  # on the CPU torch's threads, and so rfdetr's budget, are every core already
    ),
    _patch(
        "eager_validation",
        (f"{MODULE}._resolve_eval_model",),
        "validation runs the model uncompiled: no eval-graph compile at each job's first validation",
        gpu_only=True,  # rfdetr compiles only on CUDA: on the CPU there is no wrapper to look through
    ),
    _patch(
        "checkpoints_in_background",
        BUILD_TRAINER[:1],
        "each epoch's last.ckpt is written by a background thread (Lightning's AsyncCheckpointIO) as the next trains",
        reads=BUILD_TRAINER[1:],
        # on the CPU the writer takes the cores the model computes on: epochs ran longer by what the wait saved
        gpu_only=True,
    ),
    _callback(
        "static_cuda_graphs",
        "StaticCudaGraphs",
        "rfdetr's compiled model: compiled again for the one training shape, replayed as CUDA graphs",
        "profiles with compile and cuda_graphs on: no dynamic-shape compile, CUDA graph replay, compiled losses",
        reads=(f"{MODULE}.__init__", f"{CRITERION}.enable_compiled_detection_losses"),
    ),
    _callback(
        "gc_freeze",
        "FreezeAfterWarmup",
        "CPython's full garbage collections over the training process's long-lived objects",
        "after each epoch's first steps the process's objects are frozen, so full collections skip them",
    ),
    _callback(
        "next_epoch_during_validation",
        "NextEpochDuringValidation",
        "when the training loader's workers start on an epoch: during the previous validation, not after it",
        "the loader's workers decode the next epoch's first batches while the model validates",
        reads=(SAMPLER_EPOCH,),
    ),
    _callback(
        "validation_loader_ahead",
        "ValidationLoaderAhead",
        "when the validation loader's workers start: during the epoch's last training steps, not after them",
        "the loader's workers decode the first validation batches while the last training steps run",
        reads=(SAMPLER_EPOCH,),
    ),
)
NAMES: tuple[str, ...] = tuple(speedup.name for speedup in SPEEDUPS)
# what train.speedups auto and all select: the speedups that compute rfdetr's own values and were measured to gain
BY_DEFAULT: tuple[str, ...] = tuple(speedup.name for speedup in SPEEDUPS if not speedup.only_when_named)
SETTINGS = ("auto", "all", "none")  # train.speedups: one of these, or a list of NAMES (and `all`)

HOOKS: tuple[Hook, ...] = (
    Hook(
        "coco_metrics",
        "rfdetr_coco_pipeline.hooks.coco_metrics:captured_coco_metrics",
        (f"{COCO_EVAL}:COCOEvalCallback._compute_map_metric",),
        "the evaluate stage keeps rfdetr's whole COCO result: AP by object size, AR at 1, 10 and 100 detections",
        "the evaluate stage reports what rfdetr's evaluate() returns: AP, AP50, AP75, AR@100 and AP per class",
    ),
    Hook(
        "fp8_validation",
        "rfdetr_coco_pipeline.hooks.fp8_validation:validation_of_any_size",
        (f"{MODULE}.validation_step",),
        "on the FP8 route, a validation batch off Transformer Engine's shape rule runs without FP8",
        "a validation set whose last batch breaks the rule stops before training, naming the fix",
    ),
    Hook(
        "trainer_plugins",
        "rfdetr_coco_pipeline.hooks.trainer_plugins:trainer_plugins",
        BUILD_TRAINER,
        "adds Lightning plugins to rfdetr's Trainer: checkpoints written durably, and the environment that lets "
        "Lightning start DDP ranks inside a SLURM job",
        "rfdetr's Trainer as built: Lightning's own checkpoint writer; inside a SLURM job Lightning expects srun to "
        "have started one task per GPU",
    ),
    Hook(
        "sigterm_at_one_step",
        "rfdetr_coco_pipeline.hooks.sigterm_at_one_step:sigterm_at_one_step",
        (
            f"{SIGNAL_CONNECTOR}._sigterm_notifier_fn",
            f"{EPOCH_LOOP}._broadcast_sigterm_tensor",
            f"{EPOCH_LOOP}.advance",
            f"{EPOCH_LOOP}.on_advance_end",
        ),
        "with several ranks, a SIGTERM to any of them stops every rank at the start of the same training step",
        "Lightning's own SIGTERM handling, in which ranks warned at different moments can wait on each other until "
        "the job is killed",
    ),
)


class SpeedupError(StageError):
    """train.speedups cannot be honoured; the message says why and what to do."""


# ------------------------------------------------------------------------------------------------ the gate ----


def resolve(path: str) -> Any:
    """The object at "module:attribute" or "module:Class.attribute"; AttributeError or ImportError when missing."""
    module, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module)
    for name in attribute.split("."):
        target = inspect.getattr_static(target, name)
    return target


def source_digest(target: Any) -> str | None:
    """A short digest of a function's or class's source, None for an object without source (a constant, a
    builtin)."""
    function = getattr(target, "fget", None) or getattr(target, "__func__", None) or target
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def target_problem(path: str) -> str | None:
    """Why `path` is not what its hooks were checked against (missing, or its source changed), or None."""
    from rfdetr_coco_pipeline.hooks.checked_sources import CHECKED

    try:
        target = resolve(path)
    except (ImportError, AttributeError):
        return f"{path} is missing from the installed packages"
    checked = CHECKED.get(path)
    if checked is None:
        return None  # only its existence was checked: no source of its own (a constant), or not rfdetr's
    digest = source_digest(target)
    if digest not in checked:
        return f"{path} changed since it was checked (source digest {digest}, checked {', '.join(checked)})"
    return None


def gate(hooks: Iterable[Hook | Speedup]) -> dict[str, str]:
    """For each of `hooks` whose targets are not all as checked: its name and why."""
    problems = {}
    for hook in hooks:
        found = [problem for path in hook.targets if (problem := target_problem(path))]
        if found:
            problems[hook.name] = "; ".join(found)
    return problems


def check_hooks() -> dict[str, str]:
    """Check every always-on hook's targets as a stage starts and log the result: those that stay off, why, and
    what runs instead. Returns them by name."""
    problems = gate(HOOKS)
    for hook in HOOKS:
        if hook.name in problems:
            log.warning("Hook %s is off: %s. Instead: %s.", hook.name, problems[hook.name], hook.fallback)
    log.info("Hooks into rfdetr checked: %d of %d as checked", len(HOOKS) - len(problems), len(HOOKS))
    return problems


def hook_off_reason(name: str) -> str | None:
    """Why the always-on hook `name` stays off here (its targets are not as checked, which the log says, with what
    runs instead), or None when it can be used."""
    hook = next(hook for hook in HOOKS if hook.name == name)
    problem = gate([hook]).get(name)
    if problem:
        log.warning("Hook %s is off: %s. Instead: %s.", name, problem, hook.fallback)
    return problem


# --------------------------------------------------------------------------------------- train.speedups ----


def speedup_setting_problem(setting: Any) -> str | None:
    """What is wrong with a `train.speedups` value, or None: one of `SETTINGS`, or a list of known names (`all` in
    a list stands for `BY_DEFAULT`)."""
    if isinstance(setting, str):
        return None if setting in SETTINGS else f"train.speedups: {setting!r} is not one of {', '.join(SETTINGS)}"
    unknown = [name for name in setting or () if name not in NAMES and name != "all"]
    if unknown:
        return f"train.speedups: unknown speedup(s) {', '.join(unknown)} (known: all, {', '.join(NAMES)})"
    return None


def wanted_names(setting: str | Sequence[str]) -> list[str]:
    """The speedups a valid `train.speedups` asks for, in the registry's order."""
    if setting in ("auto", "all"):
        return list(BY_DEFAULT)
    if setting == "none":
        return []
    named = set(setting)
    return [name for name in NAMES if name in named or ("all" in named and name in BY_DEFAULT)]


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
    changed: dict[str, str] | None = None,
) -> Selection:
    """The speedups `setting` (train.speedups) asks for, given the installed rfdetr's version, `missing` (the
    modules that do not import here; None: `missing_modules()`), the device training runs on (`device_kind`:
    "cuda" or "cpu") and `changed` (the speedups whose targets are not as checked; None: the gate's answer).

    `auto` applies every speedup of `BY_DEFAULT` (each computes rfdetr's values, its gain measured) with the rfdetr
    version they were checked against and none with another (training is then stock rfdetr's); it leaves off, saying
    why, one whose targets changed, one whose `needs` are missing and, on the CPU, a `gpu_only` one. `all` (every
    speedup of `BY_DEFAULT`), or a list of names, trains with every speedup it asks for or refuses with
    `SpeedupError` (a `gpu_only` one applies on the CPU too). `none` applies nothing. A speedup `only_when_named`
    applies only where a list names it (`[all, name]`: every one of `BY_DEFAULT` and that one).
    """
    if problem := speedup_setting_problem(setting):
        raise SpeedupError(problem)
    wanted = wanted_names(setting)
    every = setting == "all" or (not isinstance(setting, str) and "all" in setting)
    extra = [name for name in wanted if name not in BY_DEFAULT]
    asked = ", ".join(["every speedup", *extra]) if every else ", ".join(wanted)
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
    if changed is None:
        changed = gate(speedup for speedup in SPEEDUPS if speedup.name in wanted)
    absent = {
        speedup.name: [module for module in speedup.needs if module in missing]
        for speedup in SPEEDUPS
        if speedup.name in wanted and missing.intersection(speedup.needs)
    }
    lacking = {name: f"needs {', '.join(modules)}, which this Python cannot import" for name, modules in absent.items()}
    lacking |= {name: problem for name, problem in changed.items() if name in wanted}
    if setting == "auto" and device_kind != "cuda":
        lacking |= {
            speedup.name: "gains only when training runs on a GPU (train.device: cpu)"
            for speedup in SPEEDUPS
            if speedup.gpu_only and speedup.name not in lacking
        }
    if lacking and setting != "auto":
        modules = sorted({module for found in absent.values() for module in found})
        fix = f"Install what is missing (pip install {' '.join(modules)}), or set" if modules else "Set"
        raise SpeedupError(
            f"train.speedups asks for {asked}, but {'; '.join(f'{name}: {why}' for name, why in lacking.items())}. "
            f"{fix} train.speedups: auto, which leaves {', '.join(lacking)} off and says so in the log."
        )

    def why_off(speedup: Speedup) -> str:
        if setting == "none":
            return "train.speedups: none"
        if speedup.only_when_named and setting in ("auto", "all"):
            return f"{speedup.only_when_named}: applies only where train.speedups names it"
        return "not named in train.speedups"

    return Selection(
        tuple(speedup for speedup in SPEEDUPS if speedup.name in wanted and speedup.name not in lacking),
        tuple(
            (speedup, lacking.get(speedup.name) or why_off(speedup))
            for speedup in SPEEDUPS
            if speedup.name not in wanted or speedup.name in lacking
        ),
    )


@contextmanager
def applied(selection: Selection, options: Any = None) -> Iterator[list[Any]]:
    """Within this block the selected patches are in place; yields the selected callbacks, to add to the Trainer.
    `options` holds the settings a patch takes (`Speedup.options`: the `train` settings). Afterwards rfdetr's own
    code is back, also after an error."""
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
    """The speedups as docs/speedups.md shows them."""
    rows = ["| speedup | what it does | replaces |", "| --- | --- | --- |"]
    for speedup in SPEEDUPS:
        replaces = "<br>".join(f"`{what}`" if speedup.kind == "patch" else what for what in speedup.replaces)
        why = speedup.only_when_named
        effect = f"{speedup.effect}. **Only when named:** {why}" if why else speedup.effect
        rows.append(f"| `{speedup.name}` | {effect} | {replaces} |")
    return "\n".join(rows)


def hooks_table() -> str:
    """The always-on hooks as docs/speedups.md shows them."""
    rows = ["| hook | what it does | when its targets changed |", "| --- | --- | --- |"]
    rows += [f"| `{hook.name}` | {hook.purpose} | {hook.fallback} |" for hook in HOOKS]
    return "\n".join(rows)


def all_targets() -> list[str]:
    """Every target of every hook and speedup, once each, in registry order."""
    paths = [path for hook in (*SPEEDUPS, *HOOKS) for path in hook.targets]
    return list(dict.fromkeys(paths))

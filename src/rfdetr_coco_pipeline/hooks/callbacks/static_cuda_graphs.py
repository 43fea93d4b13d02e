"""Replay the compiled model with CUDA graphs, compiled for the one input shape of fixed-resolution training.

At batch 128 the compiled recipe leaves the GPU waiting while the host launches the compiled forward and backward
kernel by kernel; a CUDA graph launches a whole recorded sequence of kernels at once. rfdetr offers that
through its public flags (`compile=True` together with `cuda_graphs=True`: Inductor's CUDA graph trees), but on that
path it compiles the model for dynamic shapes, whose warm-up is several minutes longer, and keeps the per-layer
eager losses. Without `cuda_graphs`, for fixed-resolution training, rfdetr compiles for the one training shape and
runs the layer-batched compiled losses instead.

`StaticCudaGraphs` combines the two. When rfdetr has enabled graph replay of its compiled model, it compiles the
same model again at `setup`, before anything has been compiled, with the options rfdetr chose but for the fixed
shape, and enables the compiled losses, as rfdetr's own fixed-shape path does. It replaces rfdetr's compiled model
(`RFDETRModelModule.model`) and turns on `criterion.enable_compiled_detection_losses`; rfdetr's own handling of graph
replay (marking each training and validation step, one GPU only) stays as it is.

Guarantees: the same model, weights and losses; only how the kernels are launched changes. Anything else (a CPU, a
profile with `cuda_graphs` off, a varying input shape, a segmentation or keypoint model) is left as rfdetr built it,
with the reason in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl

log = logging.getLogger(__name__)


def fixed_input_shape(train_config: Any) -> bool:
    """Whether every training batch has one shape: rfdetr's own condition for compiling without dynamic shapes."""
    from rfdetr.config import MultiScale

    return (
        train_config.multi_scale is MultiScale.OFF
        and bool(train_config.square_resize_div_64)
        and not train_config.aug_config
    )


def graph_compile_options() -> dict[str, Any]:
    """rfdetr's compile options when `cuda_graphs` is on (module_model.py), unchanged."""
    import torch._inductor.config as inductor_config

    options: dict[str, Any] = {"triton.cudagraphs": True}
    if hasattr(inductor_config.triton, "coalesce_tiling_analysis"):
        options["triton.coalesce_tiling_analysis"] = False
    return options


def compile_for_fixed_shape(module: Any) -> str:
    """Recompile `module.model` for the fixed training shape with CUDA graph replay; returns what was done."""
    import torch

    model = getattr(module, "model", None)
    if not getattr(module, "_inductor_cudagraphs", False) or not hasattr(model, "_orig_mod"):
        return "not applied: rfdetr has not enabled CUDA graph replay of a compiled model"
    if not fixed_input_shape(module.train_config):
        return "not applied: the input shape varies (multi_scale or square_resize_div_64: false)"
    if module.model_config.segmentation_head or module.model_config.use_grouppose_keypoints:
        return "not applied: only detection models are covered"
    module.model = torch.compile(model._orig_mod, dynamic=False, options=graph_compile_options())
    module.criterion.enable_compiled_detection_losses()
    return "compiled for one fixed input shape, CUDA graph replay on, layer-batched compiled losses"


class GraphCounts:
    """How many CUDA graphs Inductor's graph trees captured and how often they replayed one, counted around the
    tree manager's `record_function` and `execute_node` while `start()`ed. Only counts: nothing else changes.
    Where a torch lacks those methods, `available` is False and nothing is counted."""

    def __init__(self) -> None:
        self.captured = 0
        self.replayed = 0
        self._originals: dict[str, Any] = {}

    @property
    def available(self) -> bool:
        from torch._inductor import cudagraph_trees

        manager = getattr(cudagraph_trees, "CUDAGraphTreeManager", None)
        return all(callable(getattr(manager, name, None)) for name in ("record_function", "execute_node"))

    def start(self) -> None:
        from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

        if self._originals or not self.available:
            return
        for name, counter in (("record_function", "captured"), ("execute_node", "replayed")):
            original = getattr(CUDAGraphTreeManager, name)
            self._originals[name] = original

            def counted(manager: Any, *args: Any, _original: Any = original, _counter: str = counter) -> Any:
                setattr(self, _counter, getattr(self, _counter) + 1)
                return _original(manager, *args)

            setattr(CUDAGraphTreeManager, name, counted)

    def stop(self) -> None:
        if not self._originals:  # never started: importing Inductor only to restore nothing costs seconds
            return
        from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

        for name, original in self._originals.items():
            setattr(CUDAGraphTreeManager, name, original)
        self._originals.clear()


class StaticCudaGraphs(pl.Callback):
    """Applies `compile_for_fixed_shape` when a fit starts (see the module's text), and logs after every training
    epoch how many CUDA graphs were captured and replayed so far in this process."""

    def __init__(self) -> None:
        self.counts = GraphCounts()
        self.applied = False

    # setup runs before on_fit_start, where rfdetr's EMA callback copies the model, and before any forward:
    # nothing has been compiled yet, so the first compile is already the fixed-shape one.
    def setup(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        outcome = compile_for_fixed_shape(module)
        log.info("CUDA graphs: %s", outcome)
        self.applied = not outcome.startswith("not applied")
        if self.applied:
            self.counts.start()

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.applied and self.counts.available:
            log.info(
                "CUDA graphs after epoch %d: %d captured, %d replays",
                trainer.current_epoch,
                self.counts.captured,
                self.counts.replayed,
            )

    def teardown(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
        self.counts.stop()

"""Replay the compiled model with CUDA graphs, compiled for the one input shape of fixed-resolution training.

On an H200 at batch 128 the compiled recipe keeps the GPU busy only about 60 % of a step: the host spends most of
the rest launching the compiled forward and backward kernel by kernel (BENCHMARKS.md, `bench.profile_steps`). A
CUDA graph launches a whole recorded sequence of kernels at once. rfdetr 1.11.2 offers that through its public
flags (`compile=True` together with `cuda_graphs=True`: Inductor's CUDA graph trees), but on that path it compiles
the model for dynamic shapes and keeps the per-layer eager losses; on the H200 that compile's warm-up alone
outlasted 470 s. Without `cuda_graphs`, for fixed-resolution training, rfdetr compiles for the one training shape
and runs the layer-batched compiled losses instead.

`StaticCudaGraphs` (a Lightning callback) combines the two: when rfdetr has enabled graph replay of its compiled
model, it compiles the same model again, before anything has been compiled, with the options rfdetr chose but for
the fixed shape, and enables the compiled losses, as rfdetr's own fixed-shape path does. The model, its weights
and the losses computed are the same; only how the kernels are launched changes. rfdetr's own handling of graph
replay (marking each training and validation step, one GPU only) stays as it is. The train stage adds the callback
when the GPU profile has `compile` and `cuda_graphs` on (config.yaml: the H200 row); `bench.profile_steps
--static-graphs` uses it too. It touches rfdetr's module (`model`, `criterion.enable_compiled_detection_losses`),
so it refuses any rfdetr version but the one it was checked against.

Measured on an H200 (BENCHMARKS.md): no gain while rfdetr's matcher made the host wait (fourth session); with the
matcher's waits gone (`scripts/matching_without_waiting.py`) +8.0 % mid-epoch (successive pairs, fifth session).
The train stage ran with it through validation, the EMA model and checkpoints in the sixth session.
"""

from __future__ import annotations

import logging
from typing import Any

from scripts.common import require_supported_rfdetr

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
    """rfdetr 1.11.2's compile options when `cuda_graphs` is on (module_model.py), unchanged."""
    import torch._inductor.config as inductor_config

    options: dict[str, Any] = {"triton.cudagraphs": True}
    if hasattr(inductor_config.triton, "coalesce_tiling_analysis"):
        options["triton.coalesce_tiling_analysis"] = False
    return options


def compile_for_fixed_shape(module: Any) -> str:
    """Recompile `module.model` for the fixed training shape with CUDA graph replay; returns what was done.

    Does nothing (and says why) unless rfdetr has compiled the model with Inductor's CUDA graph trees: on a CPU,
    with several GPUs, or with a profile that leaves `cuda_graphs` off, the model stays as rfdetr built it.
    """
    import torch

    model = getattr(module, "model", None)
    if not getattr(module, "_inductor_cudagraphs", False) or not hasattr(model, "_orig_mod"):
        return "not applied: rfdetr has not enabled CUDA graph replay of a compiled model"
    if not fixed_input_shape(module.train_config):
        return "not applied: the input shape varies (multi_scale or square_resize_div_64: false)"
    if module.model_config.segmentation_head or module.model_config.use_grouppose_keypoints:
        return "not applied: only detection models were measured"
    module.model = torch.compile(model._orig_mod, dynamic=False, options=graph_compile_options())
    module.criterion.enable_compiled_detection_losses()
    return "compiled for one fixed input shape, CUDA graph replay on, layer-batched compiled losses"


def static_cuda_graphs_callback() -> Any:
    """A Lightning callback that applies `compile_for_fixed_shape` when training starts (see module doc)."""
    require_supported_rfdetr("scripts/static_cuda_graphs.py")
    import pytorch_lightning as pl

    class StaticCudaGraphs(pl.Callback):
        # setup runs before on_fit_start, where rfdetr's EMA callback copies the model, and before any forward:
        # nothing has been compiled yet, so the first compile is already the fixed-shape one.
        def setup(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
            if stage == "fit":
                log.info("CUDA graphs: %s", compile_for_fixed_shape(module))

    return StaticCudaGraphs()

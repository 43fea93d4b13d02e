"""Validate with the model as written, not with its torch.compile wrapper.

On a GPU with `compile: true`, rfdetr forwards validation batches through the compiled model (or the EMA copy
of it). Validation runs in eval mode without gradients, so torch.compile compiles a second graph for it at the
first validation, which on a cold compile cache costs far more than the uncompiled forward passes save. The cache
stays with the run, so a run pays this once; uncompiled, every validation's forward passes take a little longer.

This wraps `RFDETRModelModule._resolve_eval_model`, the one place rfdetr picks the model a validation batch runs
through: where that model is a torch.compile wrapper, validation gets the module it wraps, which holds the same
parameters. Training still runs the compiled model and its CUDA graphs. Guarantees: the same weights and the same
computation, evaluated without Inductor; in bf16 Inductor's fused kernels round differently from eager ones, so
the metrics can differ from a compiled validation's in their last digits (the evaluate stage, too, runs its model
uncompiled: `rfdetr_coco_pipeline.training.rfdetr_call.load_for_inference`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def uncompiled(model: Any) -> Any:
    """The module a torch.compile wrapper holds (`OptimizedModule._orig_mod`), or `model` itself when not wrapped."""
    return getattr(model, "_orig_mod", model)


def resolving_uncompiled(resolve: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap rfdetr's choice of the validation model so that it is never the compiled wrapper."""

    def resolve_eval_model(module: Any) -> Any:
        return uncompiled(resolve(module))

    return resolve_eval_model


def eager_validation() -> AbstractContextManager[None]:
    """Within this block, rfdetr validates with the uncompiled module of its (EMA) model (see module doc)."""
    return patch_rfdetr("rfdetr.training.module_model:RFDETRModelModule", "_resolve_eval_model", resolving_uncompiled)

"""Validate with the model as written, not with its torch.compile wrapper.

On a GPU with `compile: true`, rfdetr 1.11.2 forwards validation batches through the compiled model (or the EMA copy
of it). Validation runs in eval mode without gradients, so torch.compile compiles a second graph for it at the
first validation: on the H200 the first validation of 500 images took 132.7 s with that graph not yet in the
compile cache, against 20.1 s uncompiled (BENCHMARKS.md, "Each lever"). The cache stays with the run, so a run pays
this once. In exchange the forward pass of COCO's 5,000 validation images takes about 0.8 s longer uncompiled
(1.94 against 1.12 s), about 32 s over 40 epochs.

This wraps `RFDETRModelModule._resolve_eval_model`, the one place rfdetr picks the model a validation batch runs
through: where that model is a torch.compile wrapper, validation gets the module it wraps, which holds the same
parameters. Training still runs the compiled model and its CUDA graphs. Guarantees: the same weights and the same
computation, evaluated without Inductor; in bf16 Inductor's fused kernels round differently from eager ones, so
the metrics can differ from a compiled validation's in their last digits (the evaluate stage, too, runs its model
uncompiled: `pipeline.rfdetr_call.load_for_inference`). Shown by
`tests/test_eager_validation.py::test_validation_runs_the_compiled_models_module_without_compiling_it`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_extensions.patching import patch_rfdetr


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

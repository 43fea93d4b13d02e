"""The FP8 route validates a validation set of any size: a batch that breaks Transformer Engine's shape rule runs
without FP8.

Transformer Engine's FP8 layers take only inputs whose rows (the product of all dimensions but the last) are
multiples of 8; for RF-DETR Nano that makes every batch a multiple of `training.fp8.batch_multiple` (2 at 384 px).
`training.rfdetr_call.eval_batch_size` picks a validation batch that keeps the rule, but rfdetr's validation loader
keeps the last, smaller batch (no drop_last), and when a GPU's share of the validation set is no multiple of the
rule (an odd count such as 4,999) no batch size makes that last batch keep it. Dropping or padding it would change
what the metric counts; instead this wraps rfdetr's `RFDETRModelModule.validation_step`: a batch whose image count
breaks the rule runs inside `transformer_engine.pytorch.autocast(enabled=False)`, nested in the FP8 autocast of
Lightning's Transformer Engine plugin. Its layers then compute in the plugin's fallback dtype (bf16), the same
weights, and every image is validated exactly once; the batches that keep the rule run in FP8 as before. Training
batches are not touched (rfdetr drops the last training batch). Applied by the train stage on the FP8 route only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

MODULE = "rfdetr.training.module_model:RFDETRModelModule"


def fp8_off_for_batches_off_the_rule(multiple: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def validation_step(self: Any, batch: tuple[Any, Any], batch_idx: int) -> dict[str, Any]:
            _samples, targets = batch
            if len(targets) % multiple == 0:
                return original(self, batch, batch_idx)
            import transformer_engine.pytorch as te

            with te.autocast(enabled=False):
                return original(self, batch, batch_idx)

        return validation_step

    return wrap


def validation_of_any_size(multiple: int) -> AbstractContextManager[None]:
    """Within this block, rfdetr's validation batches whose image count is no multiple of `multiple` run without
    FP8."""
    return patch_rfdetr(MODULE, "validation_step", fp8_off_for_batches_off_the_rule(multiple))

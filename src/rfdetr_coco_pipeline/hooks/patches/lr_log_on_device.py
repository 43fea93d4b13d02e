"""Log rfdetr's learning rates without making the host wait for the GPU.

Before every optimizer step rfdetr logs the learning rate (`train/lr`, `train/lr_min`, `train/lr_max`) as
Python numbers. Lightning turns each into a tensor on the GPU by copying it there, and such a copy waits for all work
queued on the GPU: the host stops until the backward pass has finished, and only then starts the optimizer step,
the EMA update and the next batch, while the GPU has nothing to do.

This replaces `rfdetr.training.module_model.RFDETRModelModule._log_learning_rates` with one that logs the same
three values as tensors filled on the GPU (no copy, nothing to wait for), in the dtype Lightning would have given
them. Guarantees: the same names, values and logging settings reach Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def log_on_device(original: Callable[..., None]) -> Callable[..., None]:
    """rfdetr's `_log_learning_rates`, with each value a tensor filled on the module's device."""
    import torch
    from pytorch_lightning.trainer.connectors.logger_connector.result import _get_default_dtype

    def _log_learning_rates(self: Any, optimizer: Any) -> None:
        group_lrs = [group["lr"] for group in optimizer.param_groups if "lr" in group]
        if not group_lrs:
            return

        def on_device(value: float) -> Any:  # the dtype of Lightning's own conversion of a number
            return torch.full((), value, dtype=_get_default_dtype(), device=self.device)

        self.log("train/lr", on_device(group_lrs[0]), prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/lr_min", on_device(min(group_lrs)), prog_bar=False, on_step=True, on_epoch=False)
        self.log("train/lr_max", on_device(max(group_lrs)), prog_bar=False, on_step=True, on_epoch=False)

    return _log_learning_rates


def lr_log_on_device() -> AbstractContextManager[None]:
    """Within this block, rfdetr logs its learning rates without waiting for the GPU (see module doc)."""
    return patch_rfdetr("rfdetr.training.module_model:RFDETRModelModule", "_log_learning_rates", log_on_device)

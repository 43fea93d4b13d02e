"""Update rfdetr's EMA weights without making the host wait for the GPU.

After every optimizer step, rfdetr's EMA callback calls `torch.optim.swa_utils.AveragedModel
.update_parameters`, which reads its update counter, a tensor on the GPU, three times (`n_averaged == 0`,
`n_averaged > 0`, and rfdetr's decay reads `.item()`). Each read waits until the GPU has finished the step's
backward pass and optimizer update before the host can loop over the weights and go on to the next batch.

This wraps `rfdetr.training.callbacks.ema.RFDETREMACallback._update_ema_for_step` so that rfdetr's averaged model
keeps the counter's value on the host as well. It reads the GPU counter once, at the first update of a process
(the value a resumed checkpoint restored) and again after any gap in the update sequence, and then computes exactly
what `update_parameters` does: a copy of the weights at the first update, afterwards rfdetr's own foreach average
with the decay of that counter value, and the counter's increment on the GPU. Guarantees: the same EMA weights and
saved counter.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


class HostCounter:
    """The averaged model's update counter as a host int, trusted only for consecutive updates."""

    def __init__(self) -> None:
        self.value: int | None = None
        self.step: int | None = None

    def read(self, averaged: Any, step: int, interval: int) -> int:
        if self.value is None or self.step is None or step != self.step + interval:
            self.value = int(averaged.n_averaged.item())  # the one wait: first update, or after a gap
        self.step = step
        return self.value


def tensors_of(module: Any, with_buffers: bool) -> list[Any]:
    """The tensors AveragedModel averages, in its order."""
    return list(itertools.chain(module.parameters(), module.buffers())) if with_buffers else list(module.parameters())


def update_without_waiting(callback: Any, model: Any, count: int) -> None:
    """AveragedModel.update_parameters of rfdetr's averaged model, with the counter's value `count` from the host."""
    import torch

    averaged = callback._average_model
    # AveragedModel.parameters() are its module's: its own counter is a buffer, never averaged
    averaged_tensors = [tensor.detach() for tensor in tensors_of(averaged.module, averaged.use_buffers)]
    model_tensors = [
        tensor.detach().to(own.device)
        for tensor, own in zip(tensors_of(model, averaged.use_buffers), averaged_tensors, strict=False)
    ]
    if count == 0:
        for own, new in zip(averaged_tensors, model_tensors, strict=False):
            own.copy_(new)
    else:  # grouped as AveragedModel groups them for rfdetr's foreach average (multi_avg_fn)
        groups: dict[tuple[Any, Any], tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        for own, new in zip(averaged_tensors, model_tensors, strict=False):
            group = groups[(own.device, own.dtype)]
            group[0].append(own)
            group[1].append(new)
        for own_group, new_group in groups.values():
            callback._multi_avg_fn(own_group, new_group, count)
    with torch.no_grad():
        averaged.n_averaged += 1  # stays on the GPU: no wait


def with_host_counter(original: Callable[..., None]) -> Callable[..., None]:
    """Wrap RFDETREMACallback._update_ema_for_step: the averaged model's update reads the counter from the host."""

    def update_ema_for_step(callback: Any, module: Any, global_step: int) -> None:
        averaged = callback._average_model
        if averaged is None or next(averaged.parameters()).device.type == "xla":  # XLA: rfdetr's own host counter
            return original(callback, module, global_step)
        counter = callback.__dict__.setdefault("_host_counter", HostCounter())

        def update_parameters(model: Any) -> None:
            count = counter.read(averaged, global_step, callback._update_interval_steps)
            update_without_waiting(callback, model, count)
            counter.value = count + 1

        averaged.update_parameters = update_parameters  # for this call only: rfdetr decides whether it updates
        try:
            return original(callback, module, global_step)
        finally:
            del averaged.update_parameters

    return update_ema_for_step


def ema_without_waiting() -> AbstractContextManager[None]:
    """Within this block, rfdetr's EMA callback updates without waiting for the GPU (see module doc)."""
    return patch_rfdetr("rfdetr.training.callbacks.ema:RFDETREMACallback", "_update_ema_for_step", with_host_counter)

"""Update validation's metrics one batch behind, so the GPU runs the next batch's forward pass meanwhile.

rfdetr 1.11.2's `COCOEvalCallback.on_validation_batch_end` reads each batch's predictions and targets on the host
(its COCO metric update, the F1 matching, the targets' image sizes). Those reads wait for the batch's forward pass,
and while the host then does the metric work, the GPU has nothing queued: the forward passes and the metric work
of validation take turns instead of overlapping.

Within this block, at a batch's end the callback only starts copying the batch's outputs to the host (one
non-blocking copy per dtype into pinned memory, `metric_inputs_in_one_copy.HostCopy`) and keeps them. At the next
batch's end, once that batch's forward pass is queued on the GPU, it runs rfdetr's own `on_validation_batch_end`
on the kept batch, whose copies have arrived by then. At the epoch's end the last kept batch goes first, then
rfdetr's epoch end. A batch kept from a validation that did not finish is dropped when the next one starts. With
`eval_base_model` (rfdetr then runs a second forward pass from the callback) the batch is handed on at once.

Guarantees: rfdetr's callback sees every batch, in order, with the same values on the host (targets' boxes are then
scaled on the host: the same IEEE operations, one at a time), so the metrics equal rfdetr's. Shown by
`tests/test_metrics_one_batch_behind.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from rfdetr_extensions.patches.metric_inputs_in_one_copy import HostCopy
from rfdetr_extensions.patching import patch_rfdetr

CALLBACK = "rfdetr.training.callbacks.coco_eval:COCOEvalCallback"
KEPT = "_batch_kept_for_metrics"  # the callback's attribute holding the batch whose metrics are still to come


class KeptBatch:
    """A validation batch's hook arguments, its outputs on their way to the host."""

    def __init__(self, trainer: Any, module: Any, outputs: dict[str, Any], batch: Any, *indices: Any) -> None:
        self.trainer, self.module, self.batch, self.indices = trainer, module, batch, indices
        self.results = HostCopy(outputs["results"])
        self.targets = HostCopy(outputs["targets"])
        self.rest = {key: value for key, value in outputs.items() if key not in ("results", "targets")}

    def hand_to(self, callback: Any, batch_end: Callable[..., None]) -> None:
        outputs = {**self.rest, "results": self.results.result(), "targets": self.targets.result()}
        batch_end(callback, self.trainer, self.module, outputs, self.batch, *self.indices)


def settle(callback: Any, batch_end: Callable[..., None]) -> None:
    """Hand the kept batch, if any, to rfdetr's batch end."""
    kept = callback.__dict__.pop(KEPT, None)
    if kept is not None:
        kept.hand_to(callback, batch_end)


def keep_one_batch(batch_end: Callable[..., None]) -> Callable[..., None]:
    from collections.abc import Mapping

    def on_validation_batch_end(callback: Any, trainer: Any, module: Any, outputs: Any, batch: Any, *indices: Any):
        if not isinstance(outputs, Mapping) or callback._eval_base_model:
            settle(callback, batch_end)
            return batch_end(callback, trainer, module, outputs, batch, *indices)
        kept = KeptBatch(trainer, module, dict(outputs), batch, *indices)  # copies start before the next forward
        settle(callback, batch_end)
        callback.__dict__[KEPT] = kept
        return None

    return on_validation_batch_end


def settle_first(epoch_end: Callable[..., None], batch_end: Callable[..., None]) -> Callable[..., None]:
    def on_validation_epoch_end(callback: Any, trainer: Any, module: Any) -> None:
        settle(callback, batch_end)
        epoch_end(callback, trainer, module)

    return on_validation_epoch_end


def drop_kept(epoch_start: Callable[..., None]) -> Callable[..., None]:
    def on_validation_epoch_start(callback: Any, trainer: Any, module: Any) -> None:
        callback.__dict__.pop(KEPT, None)
        epoch_start(callback, trainer, module)

    return on_validation_epoch_start


@contextmanager
def metrics_one_batch_behind() -> Iterator[None]:
    """Within this block, rfdetr's validation metrics follow one batch behind the forward passes (see module doc)."""
    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback

    batch_end = COCOEvalCallback.on_validation_batch_end
    with ExitStack() as stack:
        stack.enter_context(patch_rfdetr(CALLBACK, "on_validation_batch_end", keep_one_batch))
        stack.enter_context(
            patch_rfdetr(CALLBACK, "on_validation_epoch_end", lambda epoch_end: settle_first(epoch_end, batch_end))
        )
        stack.enter_context(patch_rfdetr(CALLBACK, "on_validation_epoch_start", drop_kept))
        yield

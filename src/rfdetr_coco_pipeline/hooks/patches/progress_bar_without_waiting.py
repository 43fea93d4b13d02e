"""Show the progress bar's loss and learning rate without making the host wait for the GPU every step.

rfdetr logs five values to the progress bar at every training step (`loss`, `loss_cls`, `loss_box`,
`loss_giou`, `train/lr`), as tensors on the GPU. At the end of every step Lightning turns each into a Python number
(`_ResultCollection.metrics` calls `convert_tensors_to_scalars`, that is `.item()`), and the first of those reads
waits for everything queued on the GPU: the backward pass, the optimizer step and the EMA update. Meanwhile the host
does nothing, and once the read returns the GPU has nothing to do until the host has fetched, copied and launched
the next step.

This replaces `_ResultCollection.metrics` with one that, for a step's progress-bar values on the GPU, starts a copy
to pinned host memory that does not wait, and shows the newest value whose copy has already arrived (`ShownScalars`):
on the GPU usually the previous step's, on the CPU the current one (its copy is done at once). Lightning's
`convert_tensors_to_scalars` in that module is replaced by one that leaves the tensors to it.

Guarantees: the progress bar shows only values the run logged, at most a few steps old, and its epoch-end values as
Lightning shows them; nothing else reads these numbers (loggers, callbacks and checkpoints get Lightning's own
tensors). Each name's very first value is read waiting, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr_all

RESULTS = "pytorch_lightning.trainer.connectors.logger_connector.result"


class ShownScalars:
    """Per progress-bar name, the newest value that has reached the host, without waiting for the GPU.

    `read(name, value)` starts a non-blocking copy of `value` to pinned memory when none of that name is on its way,
    then returns the newest copy that has arrived (a CUDA event says so). A CPU tensor's copy arrives at once."""

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        self.convert = convert  # Lightning's own conversion, which waits: for a name's first value only
        self.on_their_way: dict[str, tuple[Any, Any]] = {}  # name: (host copy, CUDA event or None)
        self.copied: dict[str, Any] = {}  # name: the tensor last copied (a step's value is read more than once)
        self.shown: dict[str, float] = {}

    def read(self, name: str, value: Any) -> Any:
        import torch

        if value.numel() != 1:  # Lightning refuses these; let it say so
            return self.convert(value)
        self.take_arrived(name)
        if name not in self.on_their_way and self.copied.get(name) is not value:
            host = torch.empty((), dtype=value.dtype, pin_memory=value.is_cuda)
            host.copy_(value.detach().reshape(()), non_blocking=value.is_cuda)
            event = None
            if value.is_cuda:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(value.device))
            self.on_their_way[name], self.copied[name] = (host, event), value
            self.take_arrived(name)  # a CPU tensor's copy is there at once
        if name not in self.shown:
            self.shown[name] = self.convert(value)
        return self.shown[name]

    def take_arrived(self, name: str) -> None:
        """If the copy of `name` on its way has reached the host, it becomes the value shown (no wait)."""
        if name in self.on_their_way:
            host, event = self.on_their_way[name]
            if event is None or event.query():
                self.shown[name] = host.item()
                del self.on_their_way[name]


def metrics_without_waiting(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `_ResultCollection.metrics`: during steps its progress-bar tensors go through `ShownScalars`; at an
    epoch's end (no `on_step`) they are converted as Lightning does."""
    import pkgutil

    import torch

    convert = pkgutil.resolve_name(f"{RESULTS}:convert_tensors_to_scalars")
    shown = ShownScalars(convert)

    def metrics(self: Any, on_step: bool) -> Any:
        found = original(self, on_step)
        read = shown.read if on_step else (lambda _name, value: convert(value))
        found["pbar"] = {
            name: read(name, value) if isinstance(value, torch.Tensor) else value
            for name, value in found["pbar"].items()
        }
        return found

    metrics.shown = shown  # type: ignore[attr-defined]
    return metrics


def _tensors_left_as_they_are(_original: Callable[..., Any]) -> Callable[[Any], Any]:
    return lambda value: value


@contextmanager
def progress_bar_without_waiting() -> Iterator[None]:
    """Within this block Lightning's progress bar shows values without waiting for the GPU (see module doc)."""
    # the wrapper must capture Lightning's conversion before the module's name is swapped: entered in this order
    with patch_rfdetr_all(
        (f"{RESULTS}:_ResultCollection", "metrics", metrics_without_waiting),
        (RESULTS, "convert_tensors_to_scalars", _tensors_left_as_they_are),
    ):
        yield

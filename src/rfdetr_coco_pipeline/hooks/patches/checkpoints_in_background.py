"""Write each epoch's `last.ckpt` in a background thread while the next epoch trains.

rfdetr has Lightning's `ModelCheckpoint` write `last.ckpt` (weights, EMA weights, optimizer state: 485 MB for
Nano) after every epoch, on the training thread (through the workflow's durable writer,
`training.checkpoints.DurableCheckpointIO`), and the GPU waits. EpochLog's `since_previous_epoch_seconds` measures
that wait.

Within this block every Trainer rfdetr builds (`rfdetr.training.build_trainer`) gets `HostSnapshotCheckpointIO`,
Lightning's own `AsyncCheckpointIO` (one writer thread; an error in it is raised at the next save or when training
ends; the thread is joined when the Trainer tears down, before `fit` returns) with one change: on the training
thread it first copies the checkpoint's tensors to host memory. Lightning's plugin copies them on their device and
leaves the copy to the host to its thread, where each of the checkpoint's 2,328 tensors (Nano) would wait behind
the training steps already queued on the GPU.

Guarantees: the file holds the checkpoint as it was when Lightning asked for it (point-in-time copies), written by
the checkpoint plugin the Trainer was given (the durable writer) as before, complete when training ends (also after
an error or a SIGTERM: Lightning's teardown joins the thread). A job killed within the seconds the write takes keeps
the previous epoch's `last.ckpt`, and resumes from it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.plugins.io import AsyncCheckpointIO, CheckpointIO

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def host_snapshot(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`checkpoint` with every tensor on the host: GPU tensors copied there now, host tensors as they are (Lightning's
    plugin clones those)."""
    return apply_to_collection(checkpoint, torch.Tensor, lambda tensor: tensor.detach().to("cpu"))


class HostSnapshotCheckpointIO(AsyncCheckpointIO):
    """Lightning's AsyncCheckpointIO, taking its snapshot on the host (see the module's text)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        super().save_checkpoint(host_snapshot(checkpoint), *args, **kwargs)


def with_background_checkpoints(build_trainer: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `build_trainer`, its checkpoints written in the background by the checkpoint plugin it is given (the
    workflow's durable writer) or, without one, by Lightning's."""

    def build(*args: Any, **kwargs: Any) -> Any:
        plugins = list(kwargs.get("plugins", []))
        writer = next((plugin for plugin in plugins if isinstance(plugin, CheckpointIO)), None)
        plugins = [plugin for plugin in plugins if plugin is not writer]
        return build_trainer(*args, **{**kwargs, "plugins": [*plugins, HostSnapshotCheckpointIO(writer)]})

    return build


def checkpoints_in_background() -> AbstractContextManager[None]:
    """Within this block, the Trainers rfdetr builds write their checkpoints in a background thread."""
    return patch_rfdetr("rfdetr.training", "build_trainer", with_background_checkpoints)

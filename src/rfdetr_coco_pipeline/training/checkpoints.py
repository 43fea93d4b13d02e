"""Checkpoints written so that a crash or a full disk never leaves a damaged one where the next job looks.

Lightning writes a checkpoint through an fsspec transaction: a temporary file where fsspec puts it, then a move.
Where that is another file system than the checkpoint's (a node-local TMPDIR, results on shared storage: the usual
cluster), the move is a copy straight into `last.ckpt`, and a disk that fills or a node that dies during it leaves
the file cut short; nothing is flushed to disk either. `DurableCheckpointIO`, a Lightning checkpoint plugin, writes
each local checkpoint to a temporary file in the checkpoint's own folder, flushes it to disk, renames it into place
and flushes the folder: the file is the old checkpoint or the new one, whatever TMPDIR is. The in-progress
checkpoint it replaces stays as `previous.ckpt` (a second name for the same file, no copy) until the next one is
written, so that a `last.ckpt` damaged later (a disk error, a file cut by hand) costs one epoch. A write that fails
removes its temporary file and leaves the old checkpoint as it was; a full disk ends the job with what to do.
Checkpoints on object storage keep Lightning's own writer.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.plugins import TorchCheckpointIO
from lightning_fabric.utilities.cloud_io import get_filesystem

from rfdetr_coco_pipeline.common import StageError, log, sync_folder

KEPT_AS_PREVIOUS = {"last.ckpt": "previous.ckpt"}  # checkpoint -> the name its predecessor keeps


class DurableCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        write_durably(checkpoint, Path(path))


def write_durably(checkpoint: dict[str, Any], path: Path) -> None:
    """`torch.save` of `checkpoint` to `path` through a temporary file beside it (see the module's text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # a writer killed mid-write leaves its temporary file; one process writes a run's checkpoints (the state lock)
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        stale.unlink(missing_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    serialized = io.BytesIO()  # as Lightning does: a failed write is then the file system's error, not torch's
    torch.save(checkpoint, serialized)
    try:
        with open(partial, "wb") as handle:
            handle.write(serialized.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        if path.name in KEPT_AS_PREVIOUS and path.is_file():
            keep_as_previous(path, path.with_name(KEPT_AS_PREVIOUS[path.name]))
        os.replace(partial, path)
        sync_folder(path.parent)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StageError(
                f"No space left on the file system of {path.parent} while writing the checkpoint {path.name}: "
                "the previous checkpoint is kept as it was. Free space there (or set results_dir to a larger "
                "disk), then run snakemake again: training resumes from the last checkpoint written."
            ) from error
        raise
    finally:
        partial.unlink(missing_ok=True)
    log.debug("Checkpoint written: %s", path)


def keep_as_previous(path: Path, previous: Path) -> None:
    """Give the checkpoint about to be replaced the name `previous` too (a hard link, renamed into place, so either
    name always holds a whole file). A file system without hard links keeps no previous checkpoint."""
    link = previous.with_name(f".{previous.name}.{os.getpid()}.link")
    try:
        link.unlink(missing_ok=True)
        os.link(path, link)
        os.replace(link, previous)
    except OSError as error:
        link.unlink(missing_ok=True)
        log.debug("No %s kept beside %s: %s", previous.name, path.name, error)

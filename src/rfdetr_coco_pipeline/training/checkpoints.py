"""Checkpoints written so that a crash or a full disk never leaves a damaged one where the next job looks.

Lightning writes a checkpoint through an fsspec transaction: a temporary file where fsspec puts it, then a move.
Where that is another file system than the checkpoint's (a node-local TMPDIR, results on shared storage: the usual
cluster), the move is a copy straight into `last.ckpt`, and a disk that fills or a node that dies during it leaves
the file cut short; nothing is flushed to disk either. `DurableCheckpointIO`, a Lightning checkpoint plugin, writes
each local checkpoint to a temporary file in the checkpoint's own folder, flushes it to disk, renames it into place
and flushes the folder: the file is the old checkpoint or the new one, whatever TMPDIR is. A write that fails
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


class DurableCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        write_durably(checkpoint, Path(path))


def write_durably(checkpoint: dict[str, Any], path: Path) -> None:
    """`torch.save` of `checkpoint` to `path` through a temporary file beside it (see the module's text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    serialized = io.BytesIO()  # as Lightning does: a failed write is then the file system's error, not torch's
    torch.save(checkpoint, serialized)
    try:
        with open(partial, "wb") as handle:
            handle.write(serialized.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
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

"""Helpers every stage shares: logging, the error a user can act on, byte sizes, atomic JSON files."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import humanfriendly

log = logging.getLogger("rfdetr_coco_pipeline")


class StageError(RuntimeError):
    """A failure the user can act on: the message says what is wrong and what to do."""


def setup_logging() -> None:
    """Log to stderr, which each rule sends to its log file (and the terminal)."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's entry point: a StageError ends it with its message and exit code 1, without a traceback, since
    the message already says what is wrong and what to do."""
    setup_logging()
    try:
        main()
    except StageError as error:
        log.error("%s", error)
        sys.exit(1)


def size(n_bytes: float) -> str:
    """A byte count as people read it: 18.01 GiB, 64 KiB."""
    return humanfriendly.format_size(n_bytes, binary=True)


def where_this_runs() -> dict[str, str | None]:
    """Host, SLURM job and SLURM node of this process: staging and training must share them (a RAM disk is per
    node)."""
    return {
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
    }


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON atomically and durably: the bytes go to a temporary file in the target's own folder (so the rename
    never crosses file systems), which is flushed to disk and renamed over the target, and the folder's entry is
    flushed too. A reader never sees a half-written file, a crash leaves the old file or the new one, and a write
    that fails leaves the previous file as it was and no temporary file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        sync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries to disk, so that a rename into it survives a crash."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def md5_of_file(path: str | os.PathLike[str]) -> hashlib._Hash:
    """The MD5 of a file's bytes, read in chunks (the standard library's `hashlib.file_digest`); the digest object,
    so that more bytes can be added."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "md5")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as handle:
        return json.load(handle)

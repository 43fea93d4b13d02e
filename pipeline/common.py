"""Helpers every stage shares: logging, user-facing errors, byte formatting, atomic JSON files, the job's config.

Shown by `tests/test_common.py::test_a_stage_error_ends_the_stage_with_its_message_and_no_traceback`,
`tests/test_common.py::test_a_json_write_that_fails_leaves_the_previous_file_whole_and_nothing_beside_it` and
`tests/test_common.py::test_a_stage_run_by_hand_says_the_workflow_runs_it`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import humanfriendly

log = logging.getLogger("pipeline")


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


def run_main(main: Any) -> None:
    """Run a stage's entry point; a StageError (or a SpeedupError from `rfdetr_extensions`) ends it with its message
    and exit code 1, no traceback."""
    from rfdetr_extensions import SpeedupError

    setup_logging()
    try:
        main()
    except (StageError, SpeedupError) as error:
        log.error("%s", error)
        sys.exit(1)


def size(n_bytes: float) -> str:
    """A byte count as people read it: 18.01 GiB, 64 KiB."""
    return humanfriendly.format_size(n_bytes, binary=True)


def where_this_runs() -> dict[str, str | None]:
    """Host and SLURM job of this process: staging and training must share both (a RAM disk is per node)."""
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON atomically: a reader never sees a half-written file, and a write that fails leaves the previous file
    as it was and no temporary file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def md5_of_file(path: str | os.PathLike[str]) -> hashlib._Hash:
    """The MD5 of a file's bytes, read in chunks (the standard library's `hashlib.file_digest`); the digest object,
    so that more bytes can be added. Shown by `tests/test_download.py`, through every archive's MD5 check."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "md5")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as handle:
        return json.load(handle)


CONFIG_ENV = "PIPELINE_CONFIG"
REFETCH_ENV = "PIPELINE_REFETCH"  # "1" when snakemake was asked to rerun jobs (--forcerun and kin): rules/common.smk


def pipeline_config() -> dict[str, Any]:
    """The workflow's validated config, which rules/common.smk hands to every job's environment.

    Settings that change how a job runs but not what it produces (retries, timeouts, workers, the GPU
    profile table, staging) travel this way, so that editing them never reruns a finished job. What a job
    produces is set by its params (URLs, checksums, expected counts, the training recipe): those do.
    """
    if CONFIG_ENV not in os.environ:
        raise StageError(f"{CONFIG_ENV} is not set: this script is run by the workflow (snakemake), not by hand.")
    return json.loads(os.environ[CONFIG_ENV])

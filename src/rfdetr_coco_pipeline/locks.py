"""File locks between runs that share data: held while a step writes what another run may want, waited for by that
other run, and an error that names the file system when it cannot lock at all.

Locks are `filelock` locks (flock) on a file beside what they guard, created for every user (mode 0666), as a shared
data folder or RAM disk is. A file system that refuses locks (NFS without its lock daemon, Lustre mounted without
`flock`) fails with an error other than "held by someone else"; that becomes one message naming the folder and what to
change, instead of a wait for a holder that does not exist or a misleading "in use".
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from rfdetr_coco_pipeline.common import StageError, log

HELD = frozenset({errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK})  # the lock is someone else's
WAIT_NOTICE_SECONDS = 60.0  # how often a waiting run says it is still waiting


def no_locks_error(folder: Path, error: OSError, setting: str) -> StageError:
    """The message for a file system that cannot take a lock at all."""
    return StageError(
        f"The file system of {folder} cannot take file locks ({error.strerror or error}). The workflow locks files "
        "there so that two runs never write the same files at once. Mount it with locking (NFS: with its lock "
        f"daemon, not 'nolock'; Lustre: with 'flock'), or set {setting} in config.yaml to a folder on a file system "
        "that can lock (a local disk), then run snakemake again."
    )


@contextmanager
def waiting_lock(path: Path, what: str, setting: str) -> Iterator[None]:
    """Hold the lock file `path` for the block, waiting (and saying so in the log) while another run holds it.

    `what` says what the holder is doing, for the log; `setting` is the config key that moves the folder elsewhere,
    for the message when its file system cannot lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), mode=0o666)
    waiting_since = None
    try:
        while True:
            try:
                lock.acquire(timeout=0 if waiting_since is None else WAIT_NOTICE_SECONDS)
                break
            except Timeout:
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    log.info("Waiting for another run %s (it holds %s)", what, path)
                else:
                    minutes = (time.monotonic() - waiting_since) / 60
                    log.info("Still waiting for another run %s (%.0f min so far)", what, minutes)
    except OSError as error:
        if error.errno in HELD:
            raise
        raise no_locks_error(path.parent, error, setting) from error
    try:
        if waiting_since is not None:
            log.info("The other run is no longer %s; going on", what)
        yield
    finally:
        lock.release()

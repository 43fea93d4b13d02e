"""What the stages share about the dataset on disk and its RAM-disk copy.

A RAM-disk copy (`<ramdisk>/<stage.subdir>-<key>`) is named by what it holds: the source folder, its file count and
bytes, and a fingerprint of its content (`stage.fingerprint_of`: the MD5 of every annotation JSON and the path,
 size and modification time of every other file), so a file rewritten in place, even at the same size, makes a
new copy. Runs on the same data share one copy; runs on other data get another one, and never touch it. A run that
trains from a copy holds a shared lock on `<ramdisk>/.<copy>.users` for as long as it trains (`CopyUsers`); a copy
is removed only by a run that can take that lock alone, so never while another run reads it. The locks are POSIX
record locks: the kernel drops them when their process ends, however it ends, and the loader's forked workers do not
inherit them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from rfdetr_coco_pipeline.common import log

IMAGE_SUFFIX = ".jpg"
MARKER = ".staged.json"  # in a complete RAM-disk copy: its source, files, bytes and fingerprint


def count_images(folder: Path) -> int:
    """The JPEG files directly in `folder`."""
    with os.scandir(folder) as entries:
        return sum(1 for e in entries if e.name.endswith(IMAGE_SUFFIX) and e.is_file())


def copy_name(subdir: str, source: Path, files: int, total_bytes: int, fingerprint: str) -> str:
    """The RAM-disk folder name of a copy of `source` with this many files and bytes and this content fingerprint."""
    key = hashlib.sha256(f"{source.resolve()}|{files}|{total_bytes}|{fingerprint}".encode()).hexdigest()[:12]
    return f"{subdir}-{key}"


class CopyUsers:
    """The runs reading the RAM-disk copy `copy`: a shared POSIX lock on `<ramdisk>/.<copy name>.users` each. The
    lock file is every user's (mode 0666 whatever the umask), as the RAM disk is."""

    def __init__(self, copy: Path) -> None:
        self.copy = copy
        self.path = copy.parent / f".{copy.name}.users"
        self.fd: int | None = None

    def open(self) -> int:
        """The lock file, for reading and writing where this user may; else for reading, which a shared lock needs
        (an exclusive one then fails: such a user never removes the copy)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            return os.open(self.path, os.O_RDONLY)
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o666)
        return fd

    def hold(self) -> None:
        """Count this process among the copy's readers until it ends (blocks while a removal is under way)."""
        self.fd = self.open()
        fcntl.lockf(self.fd, fcntl.LOCK_SH)

    def in_use_by_others(self) -> bool:
        """Whether another process holds the copy (this one may hold it too)."""
        fd = self.fd if self.fd is not None else self.open()
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # converts this process's own lock, if it holds one
            used = False
        except OSError:
            used = True
        if self.fd is not None:
            fcntl.lockf(fd, fcntl.LOCK_SH)  # a reader again
        else:
            os.close(fd)
        return used

    def remove_unless_used(self) -> bool:
        """Delete the copy if no other process reads it; True when it was deleted. This process stops reading it.
        The marker goes first, so that a removal cut short never leaves a copy that looks complete."""
        fd = self.fd if self.fd is not None else self.open()
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log.info("Kept the staged copy %s: another run is training from it", self.copy)
            os.close(fd)
            self.fd = None
            return False
        try:
            if self.copy.exists():
                (self.copy / MARKER).unlink(missing_ok=True)
                shutil.rmtree(self.copy)
                log.info("Removed the staged copy %s", self.copy)
        except PermissionError as error:  # another user's copy, in a RAM disk where each removes only their own
            log.info("Kept the staged copy %s: %s", self.copy, error.strerror)
            return False
        finally:
            os.close(fd)  # drops the lock; the lock file stays, so a reader never locks a file that is gone
            self.fd = None
        return True


def reading_the_copy(stage: dict) -> tuple[dict, CopyUsers | None]:
    """Hold the RAM-disk copy that the stage report names for as long as this process runs, and return the report;
    if another run removed the copy since it was staged, the report of reading the disk copy instead."""
    if stage.get("where") != "ramdisk":
        return stage, None
    users = CopyUsers(Path(stage["path"]))
    users.hold()
    if (Path(stage["path"]) / MARKER).is_file():
        return stage, users
    reason = "the RAM-disk copy was removed after staging, before training started"
    log.warning("Training reads the dataset from disk (%s): %s", stage["source"], reason)
    return {**stage, "path": stage["source"], "where": "disk", "reason": reason}, None

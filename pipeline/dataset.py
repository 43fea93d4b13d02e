"""What the stages share about the dataset on disk and its RAM-disk copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.common import log

IMAGE_SUFFIX = ".jpg"


def count_images(folder: Path) -> int:
    """The JPEG files directly in `folder`."""
    with os.scandir(folder) as entries:
        return sum(1 for e in entries if e.name.endswith(IMAGE_SUFFIX) and e.is_file())


def remove_staged(ramdisk: Path, subdir: str) -> None:
    """Delete the RAM-disk copy `<ramdisk>/<subdir>`, if there is one."""
    target = ramdisk / subdir
    if target.exists():
        shutil.rmtree(target)
        log.info("Removed the staged copy %s", target)

"""Staging to a RAM disk: a real copy when it fits, a logged fallback to the disk copy when it does not."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from pipeline.dataset import remove_staged
from scripts.stage import MARKER, stage_dataset


def test_the_dataset_is_copied_to_the_ramdisk_and_reused(tiny_dataset, tmp_path):
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    first = stage_dataset(tiny_dataset, ramdisk, "coco", headroom_bytes=0)
    assert first["where"] == "ramdisk" and first["reason"] == "copied"
    staged = Path(first["path"])
    assert staged == ramdisk / "coco" and (staged / MARKER).is_file()
    for path in tiny_dataset.rglob("*.jpg"):
        assert (staged / path.relative_to(tiny_dataset)).read_bytes() == path.read_bytes()
    assert stage_dataset(tiny_dataset, ramdisk, "coco", headroom_bytes=0)["reason"] == "already staged"
    remove_staged(ramdisk, "coco")
    assert not staged.exists()


def test_a_copy_emptied_by_a_reboot_or_left_half_made_is_staged_again(tiny_dataset, tmp_path):
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    staged = Path(stage_dataset(tiny_dataset, ramdisk, "coco", 0)["path"])
    next(staged.rglob("*.jpg")).unlink()  # the marker no longer matches what is there
    (staged / MARKER).write_text('{"source": "elsewhere", "files": 1, "bytes": 1}')
    assert stage_dataset(tiny_dataset, ramdisk, "coco", 0)["reason"] == "copied"
    shutil.rmtree(staged)  # what a reboot does to /dev/shm
    again = stage_dataset(tiny_dataset, ramdisk, "coco", 0)
    assert again["reason"] == "copied" and len(list(Path(again["path"]).rglob("*.jpg"))) == 12


def test_a_ramdisk_too_small_falls_back_to_the_disk_copy_and_says_so(tiny_dataset, small_tmpfs, caplog):
    ramdisk = small_tmpfs("shm", "16k")
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        report = stage_dataset(tiny_dataset, ramdisk, "coco", headroom_bytes=0)
    assert report["where"] == "disk" and report["path"] == str(tiny_dataset.resolve())
    assert "free, the copy needs" in report["reason"]
    assert "reads the dataset from disk" in caplog.text
    assert list(ramdisk.iterdir()) == [ramdisk / ".coco.lock"]


def test_staging_turned_off_or_without_a_ramdisk_trains_from_disk(tiny_dataset, tmp_path):
    assert stage_dataset(tiny_dataset, tmp_path, "coco", 0, enabled=False)["where"] == "disk"
    assert "does not exist" in stage_dataset(tiny_dataset, tmp_path / "no-shm", "coco", 0)["reason"]

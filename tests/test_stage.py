"""Staging to a RAM disk: a real copy when it fits, a logged fallback to the disk copy when it does not."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.dataset import MARKER, CopyUsers, reading_the_copy
from scripts.stage import stage_dataset
from tests.helpers.workflow import REPO


def test_the_dataset_is_copied_to_the_ramdisk_and_reused(tiny_dataset, tmp_path):
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    first = stage_dataset(tiny_dataset, ramdisk, "coco", headroom_bytes=0)
    assert first["where"] == "ramdisk" and first["reason"] == "copied"
    staged = Path(first["path"])
    assert staged.parent == ramdisk and staged.name.startswith("coco-") and (staged / MARKER).is_file()
    for path in tiny_dataset.rglob("*.jpg"):
        assert (staged / path.relative_to(tiny_dataset)).read_bytes() == path.read_bytes()
    assert stage_dataset(tiny_dataset, ramdisk, "coco", headroom_bytes=0)["reason"] == "already staged"
    assert CopyUsers(staged).remove_unless_used() and not staged.exists()


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
    assert [p.name for p in ramdisk.iterdir()] == [f".{report['copy']}.lock"]  # no copy, half-made or not


def test_staging_turned_off_or_without_a_ramdisk_trains_from_disk(tiny_dataset, tmp_path):
    assert stage_dataset(tiny_dataset, tmp_path, "coco", 0, enabled=False)["where"] == "disk"
    assert "does not exist" in stage_dataset(tiny_dataset, tmp_path / "no-shm", "coco", 0)["reason"]


def test_copies_are_named_by_their_data_so_other_data_never_replaces_a_copy_in_use(tiny_dataset, tmp_path):
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    other = Path(shutil.copytree(tiny_dataset, tmp_path / "other"))
    next(other.rglob("*.jpg")).unlink()  # other content
    mine = stage_dataset(tiny_dataset, ramdisk, "coco", 0)
    stage, users = reading_the_copy(mine)  # this process trains from it
    theirs = stage_dataset(other, ramdisk, "coco", 0)
    assert theirs["copy"] != mine["copy"] and Path(mine["path"]).is_dir() and Path(theirs["path"]).is_dir()
    assert stage_dataset(Path(str(tiny_dataset) + "/"), ramdisk, "coco", 0)["reason"] == "already staged"
    assert stage["where"] == "ramdisk" and users is not None


def test_a_copy_another_process_reads_is_kept_and_removed_once_it_is_done(tiny_dataset, tmp_path):
    """Another process (a second run's training job) holds the copy; this one cannot remove it until that ends."""
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    staged = Path(stage_dataset(tiny_dataset, ramdisk, "coco", 0)["path"])
    holder = (
        f"from pipeline.dataset import CopyUsers; import sys, pathlib; c = CopyUsers(pathlib.Path({str(staged)!r}))"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", f"{holder}; c.hold(); print('holding', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert reader.stdout.readline().strip() == "holding"
    users = CopyUsers(staged)
    users.hold()
    assert users.in_use_by_others() and not users.remove_unless_used() and staged.is_dir()
    reader.communicate("")  # the other run ends (its lock goes with its process)
    users.hold()
    assert not users.in_use_by_others() and users.remove_unless_used() and not staged.exists()


def test_a_copy_removed_between_staging_and_training_is_read_from_disk(tiny_dataset, tmp_path):
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    report = stage_dataset(tiny_dataset, ramdisk, "coco", 0)
    shutil.rmtree(report["path"])
    stage, users = reading_the_copy(report)
    assert stage["where"] == "disk" and stage["path"] == report["source"] and users is None

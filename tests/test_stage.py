"""Staging to a RAM disk: a real copy when it fits, a logged fallback to the disk copy when it does not."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from rfdetr_coco_pipeline.data.dataset import MARKER, CopyUsers, reading_the_copy
from rfdetr_coco_pipeline.data.stage import manifest_of, stage_dataset
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


def test_a_file_rewritten_at_the_same_size_is_staged_as_new_data(tiny_dataset, tmp_path):
    """The same content is one copy; an image or annotation file rewritten at its size with other bytes is new data."""
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    data = Path(shutil.copytree(tiny_dataset, tmp_path / "data"))
    first = stage_dataset(data, ramdisk, "coco", 0)
    annotation = data / "annotations" / "instances_val2017.json"
    written = annotation.stat().st_mtime_ns
    annotation.write_bytes(annotation.read_bytes())  # the same annotations, written again
    os.utime(annotation, ns=(written + 10**9, written + 10**9))
    again = stage_dataset(data, ramdisk, "coco", 0)
    assert again["reason"] == "already staged" and again["copy"] == first["copy"]
    assert 0 <= again["seconds"]  # the reuse check's time, in the report as a copy's is

    image = next((data / "val2017").glob("*.jpg"))
    old = image.read_bytes()
    image.write_bytes(old[:-3] + bytes(b ^ 0xFF for b in old[-3:]))  # other bytes, the same size
    os.utime(image, ns=(image.stat().st_mtime_ns + 10**9,) * 2)
    new_image = stage_dataset(data, ramdisk, "coco", 0)
    assert new_image["reason"] == "copied" and new_image["copy"] != first["copy"]
    assert (Path(new_image["path"]) / "val2017" / image.name).read_bytes() == image.read_bytes()

    stat = annotation.stat()
    annotation.write_bytes(annotation.read_bytes().replace(b'"iscrowd": 0', b'"iscrowd": 1', 1))
    os.utime(annotation, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # other bytes, the same size and time
    assert annotation.stat().st_size == stat.st_size
    new_labels = stage_dataset(data, ramdisk, "coco", 0)
    assert new_labels["reason"] == "copied" and new_labels["copy"] not in (first["copy"], new_image["copy"])
    assert Path(first["path"]).is_dir()  # the first copy stays for a run that may still read it


def test_a_copy_another_process_reads_is_kept_and_removed_once_it_is_done(tiny_dataset, tmp_path):
    """Another process (a second run's training job) holds the copy; this one cannot remove it until that ends."""
    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    staged = Path(stage_dataset(tiny_dataset, ramdisk, "coco", 0)["path"])
    holder = (
        "from rfdetr_coco_pipeline.data.dataset import CopyUsers; import sys, pathlib; "
        f"c = CopyUsers(pathlib.Path({str(staged)!r}))"
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


def test_the_fingerprint_orders_paths_by_their_components(tmp_path):
    """A copy staged before the check worked on strings keeps its name: the fingerprint is the SHA-256 of the files in
    `pathlib`'s order, which differs from plain string order where a name holds a character below "/"."""
    for folder in ("a-b", "a", "a.c", "A", "a/deeper", "annotations"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "x.jpg").write_bytes(folder.encode())
    (tmp_path / "annotations" / "instances_val2017.json").write_text('{"images": []}')
    (tmp_path / "top.jpg").write_bytes(b"top")
    (tmp_path / MARKER).write_text("{}")  # a staged copy's marker: not part of what the copy holds

    files = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*") if path.is_file() and path.name != MARKER)
    summary = hashlib.sha256()
    for relative in files:  # as pathlib sorts them: component by component
        path = tmp_path / relative
        if relative.suffix == ".json":
            what = "md5 " + hashlib.md5(path.read_bytes()).hexdigest()
        else:
            what = f"{path.stat().st_size} {path.stat().st_mtime_ns}"
        summary.update(f"{relative.as_posix()}\0{what}\n".encode())

    manifest, listed = manifest_of(tmp_path, workers=2)
    assert manifest.fingerprint == summary.hexdigest()
    assert sorted(listed) == sorted(relative.as_posix() for relative in files)
    assert (manifest.files, manifest.bytes) == (len(files), sum((tmp_path / f).stat().st_size for f in files))
    assert [str(f) for f in files].index("a/x.jpg") < [str(f) for f in files].index("a-b/x.jpg")  # the orders differ


def test_the_staged_train_annotations_give_rfdetr_the_same_targets(tiny_dataset, tmp_path):
    """train2017's annotations are staged without segmentation polygons; rfdetr's training dataset reads the same
    targets from the copy as from the source, image for image. val2017's annotations are staged byte for byte."""
    from rfdetr.datasets.coco import CocoDetection

    ramdisk = tmp_path / "shm"
    ramdisk.mkdir()
    staged = Path(stage_dataset(tiny_dataset, ramdisk, "coco", 0)["path"])
    source_json = json.loads((tiny_dataset / "annotations" / "instances_train2017.json").read_text())
    staged_json = json.loads((staged / "annotations" / "instances_train2017.json").read_text())
    assert all("segmentation" in annotation for annotation in source_json["annotations"])
    assert not any("segmentation" in annotation for annotation in staged_json["annotations"])
    for annotation in source_json["annotations"]:
        del annotation["segmentation"]
    assert staged_json == source_json
    for name in ("instances_val2017.json",):
        assert (staged / "annotations" / name).read_bytes() == (tiny_dataset / "annotations" / name).read_bytes()

    def dataset(root: Path) -> CocoDetection:
        return CocoDetection(root / "train2017", root / "annotations" / "instances_train2017.json", transforms=None)

    from_source, from_copy = dataset(tiny_dataset), dataset(staged)
    assert len(from_source) == len(from_copy) == len(source_json["images"])
    for index in range(len(from_source)):
        (_, expected), (_, target) = from_source[index], from_copy[index]
        assert expected.keys() == target.keys()
        for key, value in expected.items():
            assert torch.equal(value, target[key]), (index, key)

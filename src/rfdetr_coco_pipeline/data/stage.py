"""Copy the verified dataset to a RAM disk (/dev/shm) when it fits, else train from the disk copy.

This runs at the start of every training job, on the node that trains: /dev/shm belongs to that node and is emptied
by a reboot, so a staged copy made by another job could be missing. The copy is named by what it holds
(`dataset.copy_name`, with a content fingerprint from `fingerprint_of`), so runs on the same data share it and runs
on other data leave it alone; a complete copy carries a marker and is reused. When the RAM disk lacks room, copies
of this workflow that no run reads any more are removed first (`dataset.CopyUsers`). A reboot costs a re-stage,
never a re-download: the disk copy stays where it is. The copy holds every file as it is but one: train2017's
annotations without their segmentation polygons (`copy_without_segmentation`).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rfdetr_coco_pipeline.common import StageError, log, md5_of_file, read_json, size, where_this_runs, write_json
from rfdetr_coco_pipeline.data.dataset import MARKER, CopyUsers, copy_name
from rfdetr_coco_pipeline.locks import waiting_lock

PAGE_BYTES = 4096  # tmpfs stores every file in whole pages
ANNOTATIONS = "annotations"  # COCO's folder of annotation JSONs
ANNOTATION_SUFFIX = ".json"  # read whole for the fingerprint; images are known by path, size and modification time
# Read by training alone, which every block starts by parsing; val2017's stay whole for the COCO evaluation.
TRAIN_ANNOTATIONS = f"{ANNOTATIONS}/instances_train2017.json"


@dataclass(frozen=True)
class Manifest:
    files: int
    bytes: int
    fingerprint: str

    def ramdisk_bytes(self) -> int:
        return self.bytes + self.files * PAGE_BYTES

    def marker(self, source: Path) -> dict[str, Any]:
        """What a complete copy of `source` with this manifest records in its marker file."""
        return {
            "source": str(source.resolve()),
            "files": self.files,
            "bytes": self.bytes,
            "fingerprint": self.fingerprint,
        }


def this_nodes_report(report: Path) -> Path:
    """Where this node's staging report is: `report` itself (the rule's stage.json) on the first node of a job, and
    `stage.node<N>.json` beside it on node N of a job on several nodes (SLURM_NODEID), each of which stages its own
    RAM disk, so that the training tasks of every node read their own node's copy."""
    node = os.environ.get("SLURM_NODEID", "0")
    return report if node == "0" else report.with_name(f"{report.stem}.node{node}{report.suffix}")


def path_order(relative: str) -> list[str]:
    """Sort key of a relative POSIX path: by its components, as `pathlib` orders paths ("a/x" before "a-b/x")."""
    return relative.split("/")


def fingerprint_of(sizes: dict[str, tuple[int, int]], digests: dict[str, str]) -> str:
    """What the files of a folder hold, without reading the images: the MD5 of every annotation JSON (`digests`), and
    the path, size and modification time (ns) of every other file (`sizes`: relative POSIX path -> (bytes,
    mtime_ns)). A file rewritten in place changes its modification time, or for an annotation file its bytes."""
    summary = hashlib.sha256()
    for relative in sorted(sizes, key=path_order):
        what = f"md5 {digests[relative]}" if relative in digests else "{} {}".format(*sizes[relative])
        summary.update(f"{relative}\0{what}\n".encode())
    return summary.hexdigest()


def unreadable(error: OSError) -> None:
    """A folder of the dataset this process cannot read: stop rather than fingerprint and stage part of it."""
    raise StageError(
        f"Cannot read {error.filename} ({error.strerror}) to stage the dataset: give this user read access to the "
        "whole data_dir, or set stage.enabled: false to train from it as it is."
    ) from error


def manifest_of(folder: Path, workers: int = 8) -> tuple[Manifest, list[str]]:
    """File count, size and content fingerprint of `folder` (the marker file excluded), and its files as POSIX paths
    relative to it.

    Every training job pays for this check, so: paths stay strings (`pathlib` objects made, compared and sorted for
    each of COCO's 123,289 files took most of its time), and the annotations are hashed on `workers` threads while
    the walk goes on. The fingerprint is the one `pathlib`'s order gave."""
    sizes: dict[str, tuple[int, int]] = {}
    hashing: dict[str, Future[str]] = {}
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for root, dirs, names in os.walk(folder, onerror=unreadable):
            dirs.sort(key=lambda name: name != ANNOTATIONS)  # COCO's JSONs hash while the image folders are walked
            relative_root = os.path.relpath(root, folder)
            prefix = "" if relative_root == "." else relative_root.replace(os.sep, "/") + "/"
            for name in names:
                if name == MARKER:
                    continue
                path = os.path.join(root, name)
                stat = os.stat(path)
                sizes[prefix + name] = (stat.st_size, stat.st_mtime_ns)
                if name.endswith(ANNOTATION_SUFFIX):
                    hashing[prefix + name] = pool.submit(lambda path: md5_of_file(Path(path)).hexdigest(), path)
        digests = {relative: future.result() for relative, future in hashing.items()}
    total = sum(file_bytes for file_bytes, _mtime in sizes.values())
    return Manifest(len(sizes), total, fingerprint_of(sizes, digests)), list(sizes)


def is_complete_copy(target: Path, source: Path, manifest: Manifest) -> bool:
    marker = target / MARKER
    return marker.is_file() and read_json(marker) == manifest.marker(source)


def remove_unused_copies(ramdisk: Path, subdir: str, keep: str) -> None:
    """Free room: delete this workflow's other copies (`<subdir>-*`) that no run reads."""
    for other in sorted(ramdisk.glob(f"{subdir}-*")):
        if other.is_dir() and other.name != keep and not CopyUsers(other).in_use_by_others():
            CopyUsers(other).remove_unless_used()


def copy_without_segmentation(source: Path, target: Path) -> None:
    """Write the COCO annotation file `source` to `target` without each annotation's `segmentation`, all else as is.

    RF-DETR Nano trains a detector: rfdetr's training dataset (`rfdetr.datasets.coco.ConvertCoco` with
    `include_masks=False`) reads each annotation's box, category, area and crowd flag, never its polygons. Those
    polygons are most of COCO's 448 MB `instances_train2017.json`, which every training job parses whole before its
    first step (pycocotools' `COCO`), about three times as long as without them."""
    data = json.loads(source.read_bytes())
    for annotation in data.get("annotations", []):
        annotation.pop("segmentation", None)
    target.write_text(json.dumps(data, separators=(",", ":")))


def copy_tree(source: Path, target: Path, files: list[str], total_bytes: int, workers: int) -> None:
    for folder in sorted({os.path.dirname(f) for f in files}):
        (target / folder).mkdir(parents=True, exist_ok=True)

    def copy_one(relative: str) -> int:
        shutil.copyfile(source / relative, target / relative)
        return os.stat(source / relative).st_size

    # The JSON parse holds the GIL for seconds: in a process of its own it leaves the copy threads running.
    with (
        ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as annotations,
        ThreadPoolExecutor(max(1, workers)) as pool,
        tqdm(total=total_bytes, unit="B", unit_scale=True, desc="stage", mininterval=2.0) as bar,
    ):
        stripping = None
        if TRAIN_ANNOTATIONS in files:
            stripping = annotations.submit(
                copy_without_segmentation, source / TRAIN_ANNOTATIONS, target / TRAIN_ANNOTATIONS
            )
        for size in pool.map(copy_one, (f for f in files if f != TRAIN_ANNOTATIONS)):
            bar.update(size)
        if stripping is not None:
            stripping.result()
            bar.update(os.stat(source / TRAIN_ANNOTATIONS).st_size)


def stage_dataset(
    source: Path, ramdisk: Path, subdir: str, headroom_bytes: int, enabled: bool = True, workers: int = 8
) -> dict[str, Any]:
    """Return where training reads the dataset from ({"path", "where", "reason", ...})."""
    start = time.perf_counter()
    source = source.resolve()
    report: dict[str, Any] = {"source": str(source), **where_this_runs()}

    def on_disk(reason: str) -> dict[str, Any]:
        log.warning("Training reads the dataset from disk (%s): %s", source, reason)
        return {**report, "path": str(source), "where": "disk", "reason": reason}

    if not enabled:
        return on_disk("staging is off (stage.enabled in config.yaml)")
    if not ramdisk.is_dir():
        return on_disk(f"the RAM disk {ramdisk} does not exist")
    manifest, files = manifest_of(source, workers)
    name = copy_name(subdir, source, manifest.files, manifest.bytes, manifest.fingerprint)
    target = ramdisk / name
    report.update(files=manifest.files, bytes=manifest.bytes, copy=name)
    # One run stages a copy at a time; others wait, then reuse it. The lock file is every user's (mode 0666 whatever
    # the umask), as the RAM disk is: a second user on the node waits for it like the first.
    with waiting_lock(ramdisk / f".{name}.lock", f"staging {name}", "stage.ramdisk"):
        if is_complete_copy(target, source, manifest):
            seconds = time.perf_counter() - start
            log.info(
                "Reusing the staged copy in %s (%d files, %s; checked in %.1f s)",
                target,
                manifest.files,
                size(manifest.bytes),
                seconds,
            )
            reused = {"path": str(target), "where": "ramdisk", "reason": "already staged", "seconds": round(seconds, 2)}
            return {**report, **reused}
        partial = ramdisk / f".{name}.partial"
        for stale in (target, partial):
            shutil.rmtree(stale, ignore_errors=True)  # a half-made copy of this very data: nobody reads it
        needed = manifest.ramdisk_bytes() + headroom_bytes
        if needed > shutil.disk_usage(ramdisk).free:
            remove_unused_copies(ramdisk, subdir, keep=name)
        free = shutil.disk_usage(ramdisk).free
        if needed > free:
            return on_disk(
                f"{ramdisk} has {size(free)} free, the copy needs {size(manifest.ramdisk_bytes())} "
                f"plus {size(headroom_bytes)} headroom (stage.headroom_gb)"
            )
        log.info("Staging %d files (%s) to %s", manifest.files, size(manifest.bytes), target)
        if TRAIN_ANNOTATIONS in files:
            log.info(
                "%s is staged without segmentation polygons, which detection training does not read", TRAIN_ANNOTATIONS
            )
        try:
            copy_tree(source, partial, files, manifest.bytes, workers)
        except OSError as error:  # the RAM disk filled up under us: fall back, leave nothing half-made
            shutil.rmtree(partial, ignore_errors=True)
            return on_disk(f"copying to {ramdisk} failed: {error}")
        write_json(partial / MARKER, manifest.marker(source))
        os.replace(partial, target)
    seconds = time.perf_counter() - start
    log.info("Staged in %.1f s (%.0f MB/s)", seconds, manifest.bytes / 1e6 / max(seconds, 1e-9))
    return {
        **report,
        "path": str(target),
        "where": "ramdisk",
        "reason": "copied",
        "seconds": round(seconds, 2),
    }

"""Two runs of the workflow on one machine, in two folders, at the same time, of one user or two: they share one
RAM-disk copy of the same data, and neither removes it while the other trains from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from rfdetr_coco_pipeline.data.dataset import CopyUsers
from rfdetr_coco_pipeline.data.stage import stage_dataset
from tests.helpers.workflow import run_snakemake, start_snakemake, tiny_config, wait_for_job, write_config

pytestmark = pytest.mark.slow


def wait_until(condition, snakemake, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert snakemake.poll() is None and time.time() < deadline, "the first run ended or did not get there"
        time.sleep(0.1)


def test_two_runs_share_the_copy_of_their_data_and_neither_removes_it_under_the_other(tmp_path, server, archives):
    shm = tmp_path / "shm"  # one RAM disk for both, as /dev/shm is one per machine
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second, shm):
        folder.mkdir()
    config = tiny_config(first, server.url, archives, epochs=1)
    config["stage"]["ramdisk"] = str(shm)
    write_config(first, config)
    running = start_snakemake(first, "results/train/block_01/run.json", name="first")
    try:
        report = first / "results" / "train" / "block_01" / "stage.json"
        wait_until(
            lambda: report.is_file() and CopyUsers(shm / json.loads(report.read_text())["copy"]).in_use_by_others(),
            running,
        )
        copy = shm / json.loads(report.read_text())["copy"]
        trainer = wait_for_job(running, "scripts/train.py")
        trainer.suspend()  # the first run is busy training: it holds the copy, and will for a while
        # The second run, in its own folder, trains on the same data (the first run's data folder).
        config = tiny_config(second, server.url, archives, epochs=1)
        config.update(data_dir=str(first / "data"))
        config["stage"]["ramdisk"] = str(shm)
        write_config(second, config)
        result = run_snakemake(second, "results/train/block_01/run.json")
        assert result.returncode == 0, result.stdout[-5000:]
        staged = json.loads((second / "results" / "train" / "block_01" / "stage.json").read_text())
        assert staged["copy"] == copy.name and staged["reason"] == "already staged"  # one copy for the same data
        log = (second / "results" / "logs" / "train" / "block_01.log").read_text()
        assert f"Kept the staged copy {copy}: another run is training from it" in log
        assert copy.is_dir()  # the second run's last block did not remove what the first one reads
        trainer.resume()
        assert running.wait(timeout=600) == 0, (first / "first.out").read_text()[-5000:]
    finally:
        for process in psutil.Process(running.pid).children(recursive=True) if running.poll() is None else []:
            process.resume()
    assert not copy.exists()  # removed by the last run to finish with it
    first_log = (first / "results" / "logs" / "train" / "block_01.log").read_text()
    assert f"Removed the staged copy {copy}" in first_log


SECOND_USER = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]  # not root, with its own umask


def as_second_user(code: str) -> subprocess.CompletedProcess[str]:
    command = [*SECOND_USER, sys.executable, "-c", f"import os; os.umask(0o022); {code}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd="/tmp")


def test_a_second_user_on_the_node_reads_the_first_users_copy_and_neither_can_remove_it_under_the_other(
    tiny_dataset,
):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("starting a process as a second user needs root and setpriv")
    node = Path(tempfile.mkdtemp(prefix="shared-node-", dir="/tmp"))  # pytest's folders are root's alone
    try:
        os.chmod(node, 0o755)
        dataset = node / "coco2017"
        shutil.copytree(tiny_dataset, dataset)
        subprocess.run(["chmod", "-R", "a+rX", str(dataset)], check=True)  # a data_dir both users read
        ramdisk = node / "shm"
        ramdisk.mkdir(mode=0o1777)
        os.chmod(ramdisk, 0o1777)  # as /dev/shm: every user may write, each removes only their own files
        first = stage_dataset(dataset, ramdisk, "rfdetr-coco2017", 0)  # root, umask 022: its lock files 0644 by default
        assert first["where"] == "ramdisk"
        reader = CopyUsers(Path(first["path"]))
        reader.hold()  # the first user trains from it

        second = as_second_user(
            "import json; from pathlib import Path; from rfdetr_coco_pipeline.data.stage import stage_dataset; "
            "from rfdetr_coco_pipeline.data.dataset import CopyUsers; "
            f"report = stage_dataset(Path({str(dataset)!r}), Path({str(ramdisk)!r}), 'rfdetr-coco2017', 0); "
            "copy = CopyUsers(Path(report['path'])) if report['where'] == 'ramdisk' else None; "
            "copy and copy.hold(); "
            "print(json.dumps({**report, 'removed': copy.remove_unless_used() if copy else None}))"
        )
        assert second.returncode == 0, second.stderr[-3000:]
        report = json.loads(second.stdout.strip().splitlines()[-1])
        assert (report["where"], report["path"]) == ("ramdisk", first["path"])  # the first user's copy, reused
        assert report["removed"] is False and (Path(first["path"]) / ".staged.json").is_file()  # the first reads it
        assert reader.remove_unless_used()  # the first user, done and alone, removes it
        assert not Path(first["path"]).exists()
    finally:
        shutil.rmtree(node, ignore_errors=True)


def test_a_dataset_folder_the_user_cannot_read_stops_staging_naming_it(tiny_dataset):
    """A second user whose data_dir has a folder only its owner reads: staging stops naming that folder and what to
    do, and copies nothing, instead of fingerprinting and staging part of the data."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("starting a process as a second user needs root and setpriv")
    node = Path(tempfile.mkdtemp(prefix="shared-node-", dir="/tmp"))
    try:
        os.chmod(node, 0o755)
        dataset = node / "coco2017"
        shutil.copytree(tiny_dataset, dataset)
        subprocess.run(["chmod", "-R", "a+rX", str(dataset)], check=True)
        os.chmod(dataset / "val2017", 0o700)  # root's alone
        ramdisk = node / "shm"
        ramdisk.mkdir()
        os.chmod(ramdisk, 0o1777)
        second = as_second_user(
            "from pathlib import Path; from rfdetr_coco_pipeline.common import StageError; "
            "from rfdetr_coco_pipeline.data.stage import stage_dataset\n"
            f"try: stage_dataset(Path({str(dataset)!r}), Path({str(ramdisk)!r}), 'rfdetr-coco2017', 0)\n"
            "except StageError as error: print(error)"
        )
        assert second.returncode == 0, second.stderr[-3000:]
        message = " ".join(second.stdout.split())
        assert f"Cannot read {dataset / 'val2017'} (Permission denied) to stage the dataset" in message, message
        assert "give this user read access to the whole data_dir, or set stage.enabled: false" in message
        assert [p.name for p in ramdisk.iterdir() if not p.name.endswith(".lock")] == []  # nothing staged
    finally:
        shutil.rmtree(node, ignore_errors=True)

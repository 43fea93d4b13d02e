"""Two runs of the workflow on one machine, in two folders, at the same time: they share one RAM-disk copy of the same
data, and neither removes it while the other trains from it."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from rfdetr_coco_pipeline.data.dataset import CopyUsers
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

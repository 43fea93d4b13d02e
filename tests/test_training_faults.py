"""Fault injection against the real workflow's training: real snakemake, a real HTTP server on 127.0.0.1, real
rfdetr, processes and signals. Each fault is either survived (the next run completes and at most the epoch in
flight is lost) or refused (the run stops before harm is done, says what is wrong and what to do, and leaves no
checkpoint or block output that a later run could take for finished). docs/faults.md tells users what each fault
does and what to type."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers.figures import drawn, lines_labelled
from tests.helpers.workflow import (
    BLOCK,
    VERIFIED,
    dry_run_jobs,
    jobs_run,
    kill_group,
    rerun_after_a_kill,
    run_snakemake,
    start_snakemake,
    times_fetched,
    tiny_config,
    wait_for_file,
    wait_for_job,
    write_config,
)

pytestmark = pytest.mark.slow


def assert_nothing_trained(workdir: Path) -> None:
    """No step was trained: no checkpoint, no epoch record and no block output anywhere under results/train."""
    train = workdir / "results" / "train"
    made = [p.relative_to(train) for p in train.rglob("*") if p.is_file()] if train.exists() else []
    assert not [p for p in made if p.suffix in (".ckpt", ".pth") or p.name in ("epochs.jsonl", "metrics.csv")], made
    assert not (train / "block_01").exists() or not any((train / "block_01").iterdir()), made


# -------------------------------------------------------------------------------------------- processes ----


def test_sigkill_of_snakemake_mid_training_resumes_from_the_last_epoch(workdir, server, archives):
    # a lost node: snakemake and its training job die at once, after epoch 1 of the block was saved
    write_config(workdir, tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=2))
    snakemake = start_snakemake(workdir, BLOCK)
    checkpoint = wait_for_file(snakemake, "*/last.ckpt", workdir / "results" / "train" / "state")
    wait_for_job(snakemake, "scripts/train.py")
    kill_group(snakemake)
    output = rerun_after_a_kill(workdir, BLOCK)
    assert jobs_run(output) == ["train_block"]  # no data stage runs again
    assert all(times_fetched(server, a) == 1 for a in ("annotations_trainval2017", "val2017", "train2017"))
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "resuming the interrupted block" in log and "at epoch 2" in log
    # the figure of the block resumed mid-way: each step once, in order, over both epochs
    axes, records = drawn(workdir, ["block_01"])
    steps = lines_labelled(axes["Training loss per step"])["each step"].get_xdata()
    assert [r["epoch"] for r in records] == [0, 1] and list(steps) == sorted(set(steps)) and max(steps) == 2
    records = [json.loads(line) for line in (checkpoint.parent / "epochs.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]  # epoch 1 was not trained again
    epochs = json.loads((workdir / "results" / "train" / "block_01" / "epochs.json").read_text())
    assert [r["epoch"] for r in epochs] == [0, 1]
    # the metrics history: epoch 1's validation, saved before the kill, once, and epoch 2's
    rows = list(csv.DictReader(open(workdir / "results" / "train" / "block_01" / "metrics.csv")))
    assert [int(row["epoch"]) for row in rows if row.get("val/mAP_50_95")] == [0, 1]


def test_sigterm_of_a_training_job_stops_it_with_the_last_completed_epoch_saved(workdir, server, archives):
    write_config(workdir, tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=2))
    snakemake = start_snakemake(workdir, BLOCK)
    checkpoint = wait_for_file(snakemake, "*/last.ckpt", workdir / "results" / "train" / "state")
    wait_for_job(snakemake, "scripts/train.py").send_signal(signal.SIGTERM)
    assert snakemake.wait(timeout=300) != 0
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "Training was stopped by SIGTERM. The last completed epoch is saved; run snakemake again to resume." in log
    # epoch 0 is kept (the checkpoint is no declared output, so snakemake's clean-up of the failed job spares it),
    # and epoch 1, stopped midway, is not recorded as done
    records = [json.loads(line)["epoch"] for line in (checkpoint.parent / "epochs.jsonl").read_text().splitlines()]
    assert records == [0] and checkpoint.is_file()
    # Run again, only the block is redone, and it resumes from that checkpoint: the resuming itself is the same as
    # after a lost node, shown by test_sigkill_of_snakemake_mid_training_resumes_from_the_last_epoch.
    planned = run_snakemake(workdir, "--dry-run", BLOCK)
    assert planned.returncode == 0, planned.stdout[-3000:]
    assert dry_run_jobs(planned.stdout) == {"train_block": 1}


def test_a_second_training_process_on_the_same_run_is_refused_and_leaves_the_first_alone(workdir, server, archives):
    """Snakemake dies alone and its training job lives on (a lost login node, a SLURM job that keeps running); after
    --unlock the same command starts a second training process on the same run, which stops at once, naming the
    state folder, without touching the first one's checkpoint or records."""
    write_config(workdir, tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=2))
    snakemake = start_snakemake(workdir, BLOCK)
    try:
        checkpoint = wait_for_file(snakemake, "*/last.ckpt", workdir / "results" / "train" / "state")
        trainer = wait_for_job(snakemake, "scripts/train.py")
        trainer.suspend()  # mid-block, holding its state
        os.kill(snakemake.pid, signal.SIGKILL)  # snakemake only: the job is left running
        snakemake.wait()
        records = checkpoint.parent / "epochs.jsonl"
        before = (checkpoint.read_bytes(), records.read_bytes())
        assert run_snakemake(workdir, "--unlock").returncode == 0
        second = run_snakemake(workdir, BLOCK)
        assert trainer.is_running()
        assert second.returncode != 0
        in_use = f"Another training process is using {checkpoint.parent.relative_to(workdir)}"
        assert in_use in " ".join(second.stdout.split()), second.stdout[-6000:]
        logs = "results/logs/train/block_01.stage.log, results/logs/train/block_01.log"
        assert f"the step that failed: train_block; its logs: {logs}" in second.stdout  # both of the job's logs
        assert (checkpoint.read_bytes(), records.read_bytes()) == before
        assert not list(checkpoint.parent.glob("last.damaged-*"))
    finally:
        with contextlib.suppress(ProcessLookupError):  # the job left running, and its shell
            kill_group(snakemake)


# ------------------------------------------------------------------------------------------ environment ----


# A test-only fault, reaching rfdetr's Trainer as the workflow's own callbacks do (Lightning's callbacks_factory entry
# point, from a distribution found on PYTHONPATH): the images of the second epoch's third step become NaN.
NAN_FAULT = {
    "nan_fault.py": (
        "import pytorch_lightning as pl\n\n\n"
        "class PoisonedStep(pl.Callback):\n"
        "    def on_train_batch_start(self, trainer, module, batch, idx):\n"
        "        images = getattr(batch[0], 'tensors', batch[0])\n"
        "        if trainer.current_epoch == 1 and idx == 2:\n"
        "            images.fill_(float('nan'))\n\n\n"
        "def factory():\n"
        "    return [PoisonedStep()]\n"
    ),
    "nan_fault-0.dist-info/METADATA": "Metadata-Version: 2.1\nName: nan-fault\nVersion: 0\n",
    "nan_fault-0.dist-info/entry_points.txt": "[pytorch_lightning.callbacks_factory]\nnan_fault = nan_fault:factory\n",
}


def test_a_loss_that_is_no_longer_finite_stops_the_block_and_keeps_the_last_good_checkpoint(
    workdir, server, archives, tmp_path
):
    site = tmp_path / "nan-fault"
    for name, text in NAN_FAULT.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    write_config(workdir, tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=2))
    failed = run_snakemake(workdir, BLOCK, env={"PYTHONPATH": str(site)})
    assert failed.returncode != 0 and "Traceback" not in failed.stdout.split("train.py")[-1]
    assert re.search(r"The training loss is no longer finite \(NaN or infinite\) at epoch 2, step \d+", failed.stdout)
    assert "Try a lower train.lr" in failed.stdout
    (last,) = (workdir / "results" / "train" / "state").glob("*/last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 0  # epoch 1's, not overwritten
    assert not (workdir / BLOCK).exists()
    resumed = run_snakemake(workdir, BLOCK)  # the fault gone: the block resumes from the last good epoch
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "resuming the interrupted block" in log and "at epoch 2" in log
    # the figure of the block resumed mid-way: each step once, in order, over both epochs
    axes, records = drawn(workdir, ["block_01"])
    steps = lines_labelled(axes["Training loss per step"])["each step"].get_xdata()
    assert [r["epoch"] for r in records] == [0, 1] and list(steps) == sorted(set(steps)) and max(steps) == 2


def test_without_a_gpu_the_run_stops_before_the_first_download_unless_told_to_go_on(workdir, server, archives):
    write_config(workdir, tiny_config(workdir, server.url, archives, device="cuda", epochs=1))
    refused = run_snakemake(workdir)
    assert (
        refused.returncode != 0 and "No CUDA GPU is visible" in refused.stdout and "train.device: cpu" in refused.stdout
    )
    assert "--config preflight=false" in refused.stdout and jobs_run(refused.stdout) == []
    assert "the step that failed: check_gpus; its log: results/logs/preflight/gpus.log" in refused.stdout
    assert "then type the same command again" in refused.stdout
    assert server.requests == [] and not (workdir / "data" / "archives").exists()  # nothing fetched
    assert "No CUDA GPU is visible" in (workdir / "results" / "logs" / "preflight" / "gpus.log").read_text()
    # told to go on, the data stages run and keep their outputs; the training job stops with the same message
    failed = run_snakemake(workdir, "--config", "preflight=false")
    assert failed.returncode != 0 and "No CUDA GPU is visible" in failed.stdout
    assert_nothing_trained(workdir)
    assert (workdir / VERIFIED).is_file()


def test_a_ramdisk_too_small_trains_from_the_disk_copy(workdir, server, archives, small_tmpfs):
    config = tiny_config(workdir, server.url, archives, epochs=1)
    config["stage"]["ramdisk"] = str(small_tmpfs("shm-small", "16k"))
    write_config(workdir, config)
    result = run_snakemake(workdir, "results/train/block_01/run.json")  # the block; what follows it is not at stake
    assert result.returncode == 0, result.stdout[-3000:]
    stage = json.loads((workdir / "results" / "train" / "block_01" / "stage.json").read_text())
    assert stage["where"] == "disk" and "the copy needs" in stage["reason"]
    assert "reads the dataset from disk" in (workdir / "results" / "logs" / "train" / "block_01.stage.log").read_text()


def test_fp8_without_transformer_engine_stops_before_training(workdir, server, archives):
    write_config(workdir, tiny_config(workdir, server.url, archives, profile="rtx-pro-6000-fp8", epochs=1))
    failed = run_snakemake(workdir)
    assert failed.returncode != 0 and "asks for the FP8 route, which cannot run here" in failed.stdout
    assert "Transformer Engine does not import" in failed.stdout and "fp8_fallback: bf16" in failed.stdout
    assert_nothing_trained(workdir)

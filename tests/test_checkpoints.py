"""Checkpoints written durably (training/checkpoints.py): on a real file system that fills up during the write, the
previous checkpoint stays whole and loadable, nothing is left beside it, and the message says what to do; and the
writer is the one rfdetr's Trainer gets, under the background writer too; the checkpoint a write replaces is kept,
and a damaged last.ckpt resumes from it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.training.checkpoints import DurableCheckpointIO, write_durably
from rfdetr_coco_pipeline.training.resume import newest_state_checkpoint, plan_resume


def checkpoint(kib: int) -> dict:
    return {"epoch": kib, "weights": torch.arange(kib * 256, dtype=torch.float32)}  # 4 bytes a value


def test_a_disk_that_fills_during_the_write_keeps_the_previous_checkpoint_whole(small_tmpfs, monkeypatch):
    results = small_tmpfs("results", "1m")  # a real tmpfs of 1 MiB: room for one checkpoint of 600 KiB, not two
    monkeypatch.setenv("TMPDIR", str(small_tmpfs("tmp", "64m")))  # another file system, as a node's local /tmp
    tempfile.tempdir = None  # read TMPDIR again
    last = results / "last.ckpt"
    write_durably(checkpoint(600), last)
    before = last.read_bytes()
    with pytest.raises(StageError) as full:
        write_durably(checkpoint(610), last)
    assert f"No space left on the file system of {results} while writing the checkpoint last.ckpt" in str(full.value)
    assert "the previous checkpoint is kept" in str(full.value)
    assert last.read_bytes() == before and torch.load(last, weights_only=False)["epoch"] == 600
    assert sorted(os.listdir(results)) == ["last.ckpt"]  # no partial file left to fill the disk
    tempfile.tempdir = None


def test_a_damaged_last_checkpoint_resumes_from_the_one_it_replaced_losing_one_epoch(tmp_path):
    state = tmp_path / "state"
    last, previous = state / "last.ckpt", state / "previous.ckpt"
    write_durably(checkpoint(3), last)  # the end of epoch 3 (0-based)
    assert not previous.exists()
    write_durably(checkpoint(4), last)
    assert torch.load(previous, weights_only=False)["epoch"] == 3 and torch.load(last, weights_only=False)["epoch"] == 4
    assert previous.stat().st_ino != last.stat().st_ino  # two files, not two names of one
    assert newest_state_checkpoint(state) == (last, 4)
    cut = last.read_bytes()[: last.stat().st_size // 2]
    last.write_bytes(cut)  # damaged after it was written: a disk error, a file cut by hand
    assert newest_state_checkpoint(state) == (previous, 3)
    (damaged,) = state.glob("last.damaged-*.ckpt")
    assert damaged.read_bytes() == cut
    plan = plan_resume(previous, 3, None, 0, 10)
    assert (plan.checkpoint, plan.next_epoch) == (previous, 4)  # epoch 5 (1-based) is trained again, no more
    # neither loads: the block falls back to the previous block's checkpoint or the start
    previous.write_bytes(b"PK\x03\x04 cut short")
    assert newest_state_checkpoint(state) == (last, None)
    assert len(list(state.glob("*.damaged-*.ckpt"))) == 2


KILLED_WRITER = """
import sys, torch
from pathlib import Path
from rfdetr_coco_pipeline.training.checkpoints import write_durably
write_durably({"epoch": 9, "weights": torch.zeros(int(sys.argv[2]))}, Path(sys.argv[1]))
"""


def test_a_writer_killed_mid_write_leaves_the_checkpoint_as_it_was_and_the_next_write_clears_its_leftover(tmp_path):
    last = tmp_path / "state" / "last.ckpt"
    write_durably(checkpoint(1), last)
    before = last.read_bytes()
    values = 256 << 20  # 1 GiB of float32: written for long enough to be killed in the middle
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(last), str(values)])
    deadline = time.time() + 300
    while not [p for p in last.parent.glob(".last.ckpt.*.partial") if p.stat().st_size > 0]:
        assert writer.poll() is None and time.time() < deadline, "the write was never under way"
        time.sleep(0.002)
    writer.kill()
    writer.wait()
    (leftover,) = last.parent.glob(".last.ckpt.*.partial")
    assert leftover.stat().st_size < values * 4  # cut in the middle
    assert last.read_bytes() == before and torch.load(last, weights_only=False)["epoch"] == 1
    write_durably(checkpoint(2), last)  # the next epoch's write, by the next job
    assert sorted(os.listdir(last.parent)) == ["last.ckpt", "previous.ckpt"]


def test_the_durable_writer_is_the_one_rfdetrs_trainer_gets_also_under_the_background_writer(tiny_dataset, tmp_path):
    import rfdetr.training
    from rfdetr.config import RFDETRNanoConfig

    from rfdetr_coco_pipeline.hooks.patches.checkpoints_in_background import (
        HostSnapshotCheckpointIO,
        checkpoints_in_background,
    )
    from rfdetr_coco_pipeline.hooks.trainer_plugins import trainer_plugins
    from rfdetr_coco_pipeline.training.rfdetr_call import trainer_plugins_for
    from tests.helpers.workflow import settings_of
    from tests.test_train import rfdetr_train_config

    config = rfdetr_train_config(["csv"], tiny_dataset, tmp_path / "state" / "0123abcd")
    with trainer_plugins(trainer_plugins_for(settings_of())):
        writer = rfdetr.training.build_trainer(config, RFDETRNanoConfig(), accelerator="cpu").strategy.checkpoint_io
    assert isinstance(writer, DurableCheckpointIO)
    plugins = trainer_plugins_for(settings_of())  # as the train stage does: the gate first, then the speedups
    with checkpoints_in_background(), trainer_plugins(plugins):
        writer = rfdetr.training.build_trainer(config, RFDETRNanoConfig(), accelerator="cpu").strategy.checkpoint_io
    assert isinstance(writer, HostSnapshotCheckpointIO) and isinstance(writer.checkpoint_io, DurableCheckpointIO)

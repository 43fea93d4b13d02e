"""On SIGTERM every rank stops at the start of the same step: real Lightning DDP ranks on the CPU, a real signal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rfdetr_coco_pipeline.hooks.sigterm_at_one_step import sigterm_at_one_step
from tests.helpers.lightning_trainer import small_trainer
from tests.helpers.sigterm_ranks import SignalAndReport, Small
from tests.helpers.workflow import REPO


def test_a_sigterm_to_one_rank_only_stops_both_ranks_at_the_start_of_the_next_step(tmp_path):
    """Rank 1 alone is signalled as its step 3 begins, mid-way through the steps both ranks take together. Under
    Lightning's own handling its handler broadcasts while rank 0 waits in the gradient all-reduce, and neither
    moves again; with the hook both finish step 3 and stop as step 4 begins."""
    signalled_rank, step = 1, 3
    command = [sys.executable, "-m", "tests.helpers.sigterm_ranks", str(signalled_rank), str(step), str(tmp_path)]
    subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300, check=True)
    reports = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert reports == [{"global_step": step + 1, "stopped_by": "SIGTERMException"}] * 2


def test_a_single_rank_is_stopped_as_lightning_stops_it(tmp_path):
    """Without other ranks the hook leaves Lightning's handling: the step in progress ends, then training stops."""
    import torch
    from pytorch_lightning.utilities.exceptions import SIGTERMException
    from torch.utils.data import DataLoader, TensorDataset

    trainer = small_trainer(tmp_path, [SignalAndReport(rank=0, step=2, out=tmp_path)], max_epochs=1)
    with sigterm_at_one_step(), pytest.raises(SIGTERMException):
        trainer.fit(Small(), DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=2))
    report = json.loads((tmp_path / "rank-0.json").read_text())
    assert report == {"global_step": 3, "stopped_by": "SIGTERMException"} and trainer.received_sigterm

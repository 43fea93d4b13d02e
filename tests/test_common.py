"""What every stage shares: a StageError ends a stage with its message and exit code 1, no traceback; a JSON file is
replaced whole or not at all; a stage run by hand, outside the workflow, says so."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rfdetr_coco_pipeline.common import read_json, write_json
from rfdetr_coco_pipeline.settings import SETTINGS_ENV
from tests.helpers.workflow import REPO


def test_a_stage_error_ends_the_stage_with_its_message_and_no_traceback():
    code = (
        "from rfdetr_coco_pipeline.common import StageError, run_stage\n"
        "def main():\n"
        "    raise StageError('The archive is corrupt: delete it and run snakemake again.')\n"
        "run_stage(main)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "ERROR The archive is corrupt: delete it and run snakemake again." in result.stderr
    assert "Traceback" not in result.stderr


def test_a_json_write_that_fails_leaves_the_previous_file_whole_and_nothing_beside_it(tmp_path):
    path = tmp_path / "report" / "dataset.json"
    write_json(path, {"images": 5})
    with pytest.raises(TypeError):
        write_json(path, {"images": 6, "split": object()})  # fails halfway through writing
    assert read_json(path) == {"images": 5}
    assert [p.name for p in path.parent.iterdir()] == ["dataset.json"]


def test_a_stage_run_by_hand_says_the_workflow_runs_it(tmp_path):
    env = {name: value for name, value in os.environ.items() if name != SETTINGS_ENV}
    command = [sys.executable, str(REPO / "scripts" / "verify.py"), "--dataset", str(tmp_path), "--report", "r.json"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{SETTINGS_ENV} is not set: this script is run by the workflow (snakemake), not by hand" in result.stderr


def test_a_cudnn_torch_refuses_is_recorded_and_the_job_goes_on(monkeypatch):
    """With Transformer Engine imported on the GPU machine, torch's cuDNN version check raised (9.19 expected, 9.14
    loaded) after an FP8 block had trained; run.json records that instead of failing the job."""
    import torch

    from rfdetr_coco_pipeline.versions import software_versions

    def refused() -> int:
        raise RuntimeError(
            "cuDNN version incompatibility: PyTorch was compiled against (9, 19, 0) but found (9, 14, 0)"
        )

    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", refused)
    versions = software_versions()
    assert versions["cudnn"].startswith("unusable: cuDNN version incompatibility")
    assert versions["torch"] == torch.__version__

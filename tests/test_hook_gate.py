"""The gate through the real workflow: with an installed rfdetr whose private functions changed, the train and
evaluate stages complete on rfdetr's own code, and their logs say which hook stayed off and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.workflow import run_snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow

# Run at every Python start of the workflow (through PYTHONPATH): as each of these rfdetr modules is imported, one of
# its functions is replaced by another of the same behaviour and other source, as a new release would leave it.
CHANGED_RELEASE = """
import importlib.machinery
import sys

CHANGED = {
    "rfdetr.utilities.tensors": ("PackedTargets", "to_list"),
    "rfdetr.training.callbacks.coco_eval": ("COCOEvalCallback", "_compute_map_metric"),
}


def rewrite(owner, name):
    original = getattr(owner, name)

    def rewritten(*args, **kwargs):
        return original(*args, **kwargs)

    setattr(owner, name, rewritten)


class ChangedRelease:
    def find_spec(self, fullname, path, target=None):
        if fullname not in CHANGED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            owner, name = CHANGED[fullname]
            rewrite(getattr(module, owner), name)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, ChangedRelease())
"""


def test_with_changed_targets_training_and_evaluation_complete_on_rfdetrs_own_code(workdir, server, archives, tmp_path):
    site = tmp_path / "changed-release"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CHANGED_RELEASE)
    config = tiny_config(workdir, server.url, archives, epochs=1)
    config["export"]["formats"] = []
    write_config(workdir, config)
    result = run_snakemake(workdir, "results/eval/metrics.json", env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stdout[-5000:]

    logs = workdir / "results" / "logs"
    train_log = (logs / "train" / "block_01.log").read_text()
    assert (
        "Speedup left off: targets_one_copy: rfdetr.utilities.tensors:PackedTargets.to_list changed since it was "
        "checked"
    ) in train_log
    run = json.loads((workdir / "results" / "train" / "block_01" / "run.json").read_text())
    assert "targets_one_copy" not in run["speedups"] and "gc_freeze" in run["speedups"]  # the others stay on

    evaluate_log = (logs / "evaluate" / "evaluate.log").read_text()
    assert (
        "Hook coco_metrics is off: rfdetr.training.callbacks.coco_eval:COCOEvalCallback._compute_map_metric changed "
        "since it was checked"
    ) in evaluate_log
    assert "Instead: the evaluate stage reports what rfdetr's evaluate() returns" in evaluate_log
    metrics = json.loads((workdir / "results" / "eval" / "metrics.json").read_text())
    # rfdetr's own evaluate() result: its summary numbers, not the ones only its metric object holds
    assert metrics["AP"] == metrics["rfdetr_returned"]["val/mAP_50_95"] and metrics["AP_small"] is None
    assert Path(workdir / "results" / "eval" / "per_class.csv").is_file()

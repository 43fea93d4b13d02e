"""What a run says as it ends: on success what it made and where, on failure which step failed and what to do next.

The Snakefile's `onsuccess` and `onerror` handlers print these. A run asked for part of the workflow (the data
only, say) names only the products that exist.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from rfdetr_coco_pipeline.blocks import run_blocks
from rfdetr_coco_pipeline.settings import Settings


def products(settings: Settings) -> list[tuple[str, Path]]:
    """(what, where) of each product a finished run leaves, in the order a user looks for them."""
    results, last = settings.results_dir, list(run_blocks(settings))[-1]
    return [
        ("best weights", results / "train" / last / "best.pth"),
        *((f"{fmt.upper()} model", results / "export" / f"model.{fmt}") for fmt in settings.export.formats),
        ("evaluation on val2017", results / "eval" / "metrics.json"),
        ("AP per category", results / "eval" / "per_class.csv"),
        ("metrics of every epoch", results / "metrics.csv"),
        ("plots", results / "plots"),
    ]


def trained(settings: Settings) -> str | None:
    """One line: the epochs trained, the best mAP and its epoch, the hours, from the plot stage's summary."""
    summary_file = settings.results_dir / "plots" / "summary.txt"
    if not summary_file.is_file():
        return None
    text = summary_file.read_text()
    summary = json.loads(text[text.index("{") :])
    best = summary["best_map_50_95"]
    at = f"at epoch {summary['best_epoch']} (from 0, as metrics.csv counts)"
    result = f"best val mAP@50:95 {best:.3f} {at}" if best is not None else "no mAP yet"
    line = f"Trained {summary['epochs_trained']} epochs: {result}, {summary['train_hours']:.1f} h of training"
    evaluation = settings.results_dir / "eval" / "metrics.json"
    if evaluation.is_file():
        metrics = json.loads(evaluation.read_text())
        line += f"; the best weights on val2017: AP {metrics['AP']:.3f}, AP50 {metrics['AP50']:.3f}"
    return line


def success_summary(settings: Settings) -> str:
    """What the run made and where it is, and the commands to look at it."""
    lines = ["The workflow finished."]
    if line := trained(settings):
        lines.append(line + ".")
    made = [(what, path) for what, path in products(settings) if path.exists()]
    width = max((len(what) for what, _ in made), default=0)
    lines += [f"  {what:<{width}}  {path}" for what, path in made]
    if made:
        lines += [
            "The report of the run: snakemake --report report.html",
            f"TensorBoard: tensorboard --logdir {settings.paths.state}",
        ]
    return "\n".join(lines)


def failure_summary(snakemake_logs: str | Path | Sequence[str | Path]) -> str:
    """Which step failed and its log (read from snakemake's own log of this run, which the `onerror` handler gets),
    and that running again resumes."""
    paths = [Path(snakemake_logs)] if isinstance(snakemake_logs, str | Path) else [Path(p) for p in snakemake_logs]
    snakemake_log = next((path for path in paths if path.is_file()), None)
    text = snakemake_log.read_text() if snakemake_log else ""
    failed = re.findall(r"^Error in rule (\w+):\n(?:    .*\n)*?    log: (.+?)(?: \(check log file.*)?$", text, re.M)
    lines = ["The workflow stopped."]
    for rule, logs in failed:
        several = "," in logs
        lines.append(f"  the step that failed: {rule}; its log{'s' if several else ''}: {logs}")
    if not failed and snakemake_log:
        lines.append(f"  snakemake's own log says why: {snakemake_log}")
    lines.append(
        "Fix what the message above says, then type the same command again: what finished stays finished, and "
        "training resumes from its last completed epoch."
    )
    return "\n".join(lines)

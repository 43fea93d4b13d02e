"""The report's first page: the answer a user came for, above the workflow's graph.

Snakemake's report opens on the workflow's description; once a run has finished, the Snakefile takes this page
(`results/report/front.rst`) as that description. It holds the run's headline (best validation mAP and its epoch,
the epochs, hours and training rate, the GPU and its profile), the best weights' COCO numbers on val2017, the
training figure, and links to the rest of the report. Numbers carry COCO's three decimals, hours and rates one.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

SOURCES = {"ema": "the EMA", "regular": "the regular"}  # which model rfdetr kept as best
COCO_COLUMNS = {
    "AP": "AP",
    "AP50": "AP50",
    "AP75": "AP75",
    "AP_small": "AP small",
    "AP_medium": "AP medium",
    "AP_large": "AP large",
}


def number(value: float | None, digits: int = 3) -> str:
    """A number as the page shows it; a dash for none, and for COCO's -1 (no object of that size in the set)."""
    return "–" if value is None or value < 0 else f"{value:.{digits}f}"


def duration(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def headline(summary: dict[str, Any]) -> str:
    best = summary["best_map_50_95"]
    found = (
        f"**Best validation mAP@50:95: {number(best)}** at epoch {summary['best_epoch']} (from 0, as metrics.csv)"
        if best is not None
        else "**No validation mAP yet**"
    )
    return (
        f"{found}. Trained {summary['epochs_trained']} epochs in {duration(summary['train_hours'])} at "
        f"{number(summary['mean_images_per_second'], 1)} images/s on {summary['device']} "
        f"(GPU profile {summary['gpu_profile']})."
    )


def coco_table(evaluation: dict[str, Any]) -> str:
    """The best weights' COCO summary as an RST list table."""
    rows = [list(COCO_COLUMNS.values()), [number(evaluation.get(key)) for key in COCO_COLUMNS]]
    cells = "".join(f"   * - {row[0]}\n" + "".join(f"     - {cell}\n" for cell in row[1:]) for row in rows)
    return f".. list-table::\n   :header-rows: 1\n\n{cells}"


def front_page(summary: dict[str, Any], evaluation: dict[str, Any], figure: Path) -> str:
    """The page's reStructuredText (no `{{`: Snakemake renders the description as a Jinja template too)."""
    image = "data:image/png;base64," + base64.b64encode(figure.read_bytes()).decode()
    return "\n".join(
        [
            "RF-DETR Nano, trained from scratch on COCO2017 with the reference notebook's recipe.",
            "",
            headline(summary),
            "",
            f"The best weights ({SOURCES.get(evaluation.get('best_source'), 'the best')} model) on val2017, COCO's "
            f"protocol ({evaluation.get('max_detections', 100)} detections per image, {evaluation.get('images')} "
            "images):",
            "",
            coco_table(evaluation),
            "",
            ".. image::",
            # docutils limits a line to 10,000 characters and joins the lines of a URI
            *(f"   {image[start : start + 100]}" for start in range(0, len(image), 100)),
            "   :width: 100%",
            "   :alt: the training figure",
            "",
            # Snakemake's report defines a link target for each result file by its name and for each category
            "Where to look next: `the epochs one by one <epochs.html_>`_, `AP and AR per category <metrics.html_>`_, "
            "`the run's settings and versions <run.html_>`_ (the GPU profile, the speedups, the recipe, the "
            "software), and all the `Training`_ figures. The graph beside this text is the workflow's steps.",
            "",
        ]
    )


def write_front_page(summary_file: Path, evaluation_file: Path, figure: Path, output: Path) -> None:
    text = summary_file.read_text()
    summary = json.loads(text[text.index("{") :])
    evaluation = json.loads(evaluation_file.read_text())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(front_page(summary, evaluation, figure))

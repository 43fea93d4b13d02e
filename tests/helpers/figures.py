"""The training figure of a real run's records, drawn as the plot stage draws it, to be read like a page."""

from __future__ import annotations

import json
from pathlib import Path


def drawn(workdir: Path, block_names: list[str]):
    """The training figure of the blocks' records, as the plot stage draws it, ready to be read like a page."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from rfdetr_coco_pipeline.plotting import join_metrics
    from rfdetr_coco_pipeline.training_figure import training_figure

    blocks = [workdir / "results" / "train" / name for name in block_names]
    metrics = join_metrics([block / "metrics.csv" for block in blocks])
    records = [record for block in blocks for record in json.loads((block / "epochs.json").read_text())]
    ranges = [tuple(json.loads((block / "run.json").read_text())["epochs"]) for block in blocks]
    figure = training_figure(metrics, records, ranges)
    FigureCanvasAgg(figure).draw()
    return {axis.get_title(): axis for axis in figure.axes if axis.get_title()}, records


def lines_labelled(axis) -> dict:
    return {line.get_label(): line for line in axis.get_lines() if not line.get_label().startswith("_")}


def block_starts(axis) -> list[float]:
    """The x of each vertical line across the axis (axvline: two points, one x)."""
    vertical = [list(line.get_xdata()) for line in axis.get_lines()]
    return sorted(xs[0] for xs in vertical if len(xs) == 2 and xs[0] == xs[1])

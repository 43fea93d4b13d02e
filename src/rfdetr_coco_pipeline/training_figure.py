"""One page of figures of a training run, from its own records: what a user looks at rather than reads.

Drawn from the run's metrics.csv (the loss components and validation mAP per epoch, as rfdetr's CSVLogger wrote them)
and its epoch records (every step's loss and learning rate, each epoch's images/s and peak GPU memory). The x axis of
every panel is the epochs trained: a step's value sits within its epoch, an epoch's value at its end, and dotted
lines mark where a training block began. rfdetr logs no validation loss, so none is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

COMPONENTS = {"train/loss_ce": "classification", "train/loss_bbox": "box L1", "train/loss_giou": "box GIoU"}
MAP_SERIES = {"50_95": "mAP@50:95", "50": "mAP@50", "75": "mAP@75"}


def step_series(records: Sequence[dict[str, Any]], field: str) -> tuple[list[float], list[float]]:
    """(epochs trained, value) of every step's `field` ("loss" or "lr") across the epoch records."""
    xs, ys = [], []
    for record in records:
        values = record.get(field) or []
        xs += [record["epoch"] + (index + 1) / len(values) for index in range(len(values))]
        ys += list(values)
    return xs, ys


def smoothed(values: Sequence[float], points: int) -> list[float]:
    """A centred moving average of about a twentieth of the steps (at least one), for the trend under the noise."""
    window = max(1, points // 20)
    return pd.Series(values, dtype="float64").rolling(window, center=True, min_periods=1).mean().tolist()


def epoch_axis(axis: Any, block_starts: Sequence[int], epochs: int, label: bool = True) -> None:
    """Integer epoch ticks from 0 to `epochs` and the blocks' starts, on an axis whose x is the epochs trained."""
    axis.set_xlim(0, max(1, epochs))
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    for start in block_starts:
        axis.axvline(start, color="0.6", linestyle=":", linewidth=1)
    if label:
        axis.set_xlabel("epochs trained")
    axis.grid(alpha=0.3)


def training_figure(
    metrics: pd.DataFrame, records: Sequence[dict[str, Any]], blocks: Sequence[tuple[int, int]]
) -> Figure:
    """The run's figure (see the module's text); `blocks` are the run's epoch ranges, [first, end) each."""
    starts = [start for start, _ in blocks if start > 0]
    epochs = max((record["epoch"] + 1 for record in records), default=1)
    train = metrics.dropna(subset=["train/loss"]) if "train/loss" in metrics else metrics.iloc[0:0]
    figure = Figure(figsize=(14, 10), layout="constrained")
    grid = figure.add_gridspec(3, 3)

    loss = figure.add_subplot(grid[0, :2])
    xs, ys = step_series(records, "loss")
    loss.plot(xs, ys, color="#3b7dd8", alpha=0.3, linewidth=0.8, label="each step")
    loss.plot(xs, smoothed(ys, len(ys)), color="#1a4d99", linewidth=2, label="smoothed")
    loss.set_title("Training loss per step")
    loss.legend(loc="upper right")
    epoch_axis(loss, starts, epochs)

    rate = figure.add_subplot(grid[0, 2])
    xs, ys = step_series(records, "lr")
    rate.plot(xs, ys, color="#d8733b", label="learning rate")
    rate.set_title("Learning rate per step")
    rate.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    epoch_axis(rate, starts, epochs)

    for index, (column, name) in enumerate(COMPONENTS.items()):
        axis = figure.add_subplot(grid[1, index])
        if column in train:
            axis.plot(train["epoch"] + 1, train[column], marker="o", color="#555555")
        axis.set_title(f"Loss: {name}")
        axis.ticklabel_format(axis="y", useOffset=False)
        epoch_axis(axis, starts, epochs)

    precision = figure.add_subplot(grid[2, :2])
    for key, name in MAP_SERIES.items():
        for prefix, style, kind in (("val/mAP_", "-", ""), ("val/ema_mAP_", "--", ", EMA")):
            column = f"{prefix}{key}"
            if column in metrics:
                validated = metrics.dropna(subset=[column])
                precision.plot(validated["epoch"] + 1, validated[column], style, marker="o", label=f"{name}{kind}")
    precision.set_title("Validation mAP per epoch")
    precision.set_ylim(bottom=0)
    precision.legend(loc="upper left", ncols=3, fontsize="small")
    epoch_axis(precision, starts, epochs)

    speed = figure.add_subplot(grid[2, 2])
    ends = [record["epoch"] + 1 for record in records]
    speed.bar(ends, [record["images_per_second"] for record in records], color="#7fb37f", label="images/s")
    speed.set_ylabel("training images/s")
    memory = speed.twinx()
    memory.plot(ends, [record.get("peak_memory_gb", 0) for record in records], "o-", color="#8c3bd8")
    memory.set_ylabel("peak GPU memory, GB")
    memory.set_ylim(bottom=0)
    speed.set_title("Images/s and peak GPU memory per epoch")
    epoch_axis(speed, starts, epochs)
    speed.set_xlim(0.4, epochs + 0.6)  # whole bars
    return figure

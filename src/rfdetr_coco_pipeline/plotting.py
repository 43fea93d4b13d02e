"""Join the blocks' metrics into one metrics.csv, draw the run's training figure (`training_figure`) and rfdetr's own
loss and mAP plots (kept for parity with the reference notebook), write a short
text summary (best mAP, its epoch, training images/s), and the report's pages: the per-epoch table and the run's GPU
profile, speedups and software versions. Epochs count from 0 everywhere, as in rfdetr's metrics.csv."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on a training node

import pandas as pd  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from rfdetr_coco_pipeline.common import log, read_json  # noqa: E402
from rfdetr_coco_pipeline.report_pages import key_values, table, write_page  # noqa: E402
from rfdetr_coco_pipeline.training_figure import training_figure  # noqa: E402

MAP_COLUMN = "val/mAP_50_95"  # follows the EMA model when EMA is on (rfdetr's default)


def join_metrics(block_csvs: Sequence[Path]) -> pd.DataFrame:
    """One table for the whole run, in epoch order, from the per-block metrics files."""
    frames = [pd.read_csv(path) for path in block_csvs]
    frames = [f for f in frames if not f.empty]
    if not frames:
        raise ValueError("The training blocks wrote no metrics rows.")
    return pd.concat(frames, ignore_index=True, sort=False).sort_values(["epoch", "step"], kind="stable")


def summarize(metrics: pd.DataFrame, epoch_records: Sequence[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    val = metrics.dropna(subset=[MAP_COLUMN]) if MAP_COLUMN in metrics else metrics.iloc[0:0]
    best = val.loc[val[MAP_COLUMN].idxmax()] if not val.empty else None
    speeds = [r["images_per_second"] for r in epoch_records]
    # Epoch 0 pays compile warm-up and cold caches: report steady speed from the epochs after it.
    steady = [r["images_per_second"] for r in epoch_records if r["epoch"] > 0] or speeds
    return {
        "epochs_trained": int(metrics["epoch"].max()) + 1,
        "best_map_50_95": float(best[MAP_COLUMN]) if best is not None else None,
        "best_epoch": int(best["epoch"]) if best is not None else None,
        "final_map_50_95": float(val[MAP_COLUMN].iloc[-1]) if not val.empty else None,
        "mean_images_per_second": round(sum(steady) / len(steady), 1) if steady else None,
        "train_hours": round(sum(r["train_seconds"] + r["val_seconds"] for r in epoch_records) / 3600, 3),
        "gpu_profile": run["profile"]["name"],
        "device": run["device"],
        "recipe_id": run["recipe_id"],
    }


def summary_text(summary: dict[str, Any]) -> str:
    best = summary["best_map_50_95"]
    lines = [
        f"Run {summary['recipe_id']} on {summary['device']} (GPU profile {summary['gpu_profile']})",
        f"Epochs trained: {summary['epochs_trained']}",
        f"Best val mAP@50:95: {best:.4f} at epoch {summary['best_epoch']} (epochs count from 0, as in metrics.csv)"
        if best is not None
        else "No mAP yet",
        f"Training speed: {summary['mean_images_per_second']} images/s (mean over epochs after the first)",
        f"Training time: {summary['train_hours']:.2f} h (train + validation)",
    ]
    return "\n".join(lines) + "\n"


def epoch_table(metrics: pd.DataFrame, epoch_records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per epoch: mean training loss, validation mAP, images/s, train and validation seconds."""
    by_epoch = metrics.groupby("epoch").last(skipna=True) if not metrics.empty else metrics
    rows = []
    for record in epoch_records:
        epoch = record["epoch"]
        row = by_epoch.loc[epoch] if epoch in by_epoch.index else {}
        losses = record.get("loss") or []
        rows.append(
            {
                "epoch": epoch,
                "train loss": sum(losses) / len(losses) if losses else None,
                "val mAP@50:95": _number(row, MAP_COLUMN),
                "val mAP@50": _number(row, "val/mAP_50"),
                "images/s": float(record["images_per_second"]),
                "train s": float(record["train_seconds"]),
                "validation s": float(record["val_seconds"]),
            }
        )
    return rows


def _number(row: Any, column: str) -> float | None:
    value = row.get(column) if hasattr(row, "get") else None
    return None if value is None or pd.isna(value) else float(value)


def write_report_pages(
    metrics: pd.DataFrame,
    epoch_records: Sequence[dict[str, Any]],
    run: dict[str, Any],
    epochs_page: Path,
    run_page: Path,
) -> None:
    write_page(
        epochs_page,
        "Training, epoch by epoch",
        [("Epochs (from 0, as in metrics.csv)", table(epoch_table(metrics, epoch_records)))],
    )
    write_page(
        run_page,
        f"Run {run['recipe_id']}",
        [
            (
                "GPU profile",
                key_values({"device": run["device"], "chosen because": run["profile_reason"], **run["profile"]}),
            ),
            ("Software", key_values(run.get("versions", {}))),
            (
                "Speedups applied",
                key_values({name: "applied" for name in run.get("speedups", [])} | run.get("speedups_left_off", {})),
            ),
            ("Recipe", key_values(run["recipe"])),
        ],
    )


@dataclass(frozen=True)
class PlotFiles:
    metrics: Path
    training_plot: Path
    loss_plot: Path
    map_plot: Path
    summary: Path
    epochs_page: Path
    run_page: Path


def plot_run(blocks: Sequence[Path], files: PlotFiles) -> None:
    """The plot stage: from the blocks' output folders (in order), the run's metrics, plots, summary and pages."""
    metrics = join_metrics([block / "metrics.csv" for block in blocks])
    files.metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.to_csv(files.metrics, index=False)
    from rfdetr.visualize.training import plot_loss_metrics, plot_map_metrics

    for plot, output in ((plot_loss_metrics, files.loss_plot), (plot_map_metrics, files.map_plot)):
        plt.close(plot(str(files.metrics), output_path=str(output)))
    records = [record for block in blocks for record in read_json(block / "epochs.json")]
    ranges = [tuple(read_json(block / "run.json")["epochs"]) for block in blocks]
    training_figure(metrics, records, ranges).savefig(files.training_plot, dpi=100)
    run = read_json(blocks[-1] / "run.json")
    summary = summarize(metrics, records, run)
    files.summary.write_text(summary_text(summary) + json.dumps(summary, indent=2) + "\n")
    write_report_pages(metrics, records, run, files.epochs_page, files.run_page)
    log.info("\n%s", summary_text(summary))

"""Put runs of `bench.compare` side by side: speed ratios against the stock recipe and per-step loss differences.

usage: python -m bench.side_by_side --out DIR SUMMARY.json [SUMMARY.json ...]

Every run of every summary is listed as <summary's folder>/<run>. The first stock run is the reference: for each
other run the table gives steady images/s and its ratio to the reference, and the training loss at every step
both ran (same seed, same data order) as mean and largest absolute difference. A second stock run gives the
run-to-run noise to read those differences against. Writes <out>/side_by_side.json and <out>/loss_curves.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rfdetr_coco_pipeline.common import read_json, run_stage


def step_losses(run: dict[str, Any]) -> list[float]:
    return [loss for record in run.get("records", []) for loss in record.get("loss", [])]


def images_per_step(run: dict[str, Any]) -> int:
    record = run["records"][0]
    return round(record["images"] / max(len(record.get("loss", [])), 1))


def on_the_same_images(reference: list[float], ratio: int) -> list[float]:
    """A run with `ratio` times the batch sees in one step what the reference sees in `ratio` steps: average
    the reference's losses over those steps, so the curves are compared image for image."""
    return [sum(reference[i : i + ratio]) / ratio for i in range(0, len(reference) - ratio + 1, ratio)]


def matched_losses(reference: dict[str, Any], run: dict[str, Any]) -> tuple[list[float], list[float], int]:
    """The reference's losses on the images of each step of `run`, `run`'s losses, and how many reference steps
    make one step of `run`; both lists cut to the steps both runs made."""
    ratio = max(images_per_step(run) // images_per_step(reference), 1)
    expected = on_the_same_images(step_losses(reference), ratio)
    losses = step_losses(run)
    steps = min(len(expected), len(losses))
    return expected[:steps], losses[:steps], ratio


def loss_difference(reference: list[float], other: list[float]) -> dict[str, Any]:
    """Absolute per-step differences over the steps both runs made."""
    steps = min(len(reference), len(other))
    if steps == 0:
        return {"steps": 0}
    diffs = [abs(a - b) for a, b in zip(reference[:steps], other[:steps], strict=True)]
    mean_loss = sum(reference[:steps]) / steps
    return {
        "steps": steps,
        "mean_abs_difference": round(sum(diffs) / steps, 4),
        "max_abs_difference": round(max(diffs), 4),
        "mean_abs_difference_relative": round(sum(diffs) / steps / mean_loss, 4),
        "last_20_steps_mean": [round(sum(r[steps - 20 : steps]) / 20, 4) for r in (reference, other)]
        if steps >= 20
        else None,
    }


def named_runs(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every run of every summary (keyed by a label: its folder, its file), as <label>/<run>."""
    return {
        f"{label}/{name}": run
        for label, summary in summaries.items()
        for name, run in summary.items()
        if isinstance(run, dict) and "steady_images_per_second" in run
    }


def runs_and_reference(summaries: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], str]:
    """Every run of every summary as <folder>/<run>, and the name of the first stock run."""
    runs = named_runs(summaries)
    stock = [name for name in runs if name.endswith("/stock")]
    if not stock:
        raise SystemExit("No stock run in these summaries: run bench.compare --only stock first.")
    return runs, stock[0]


def side_by_side(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    runs, reference_name = runs_and_reference(summaries)
    reference = runs[reference_name]
    table = {}
    for name, run in runs.items():
        table[name] = {
            key: run.get(key)
            for key in (
                "steady_images_per_second",
                "mid_epoch_images_per_second",
                "first_batch_seconds",
                "epoch0_overhead_seconds",
                "first_validation_seconds",
                "peak_memory_gb",
                "profile",
            )
        }
        table[name]["ratio_to_reference"] = round(
            run["steady_images_per_second"] / reference["steady_images_per_second"], 3
        )
        if run.get("mid_epoch_images_per_second") and reference.get("mid_epoch_images_per_second"):
            table[name]["mid_epoch_ratio_to_reference"] = round(
                run["mid_epoch_images_per_second"] / reference["mid_epoch_images_per_second"], 3
            )
        if name != reference_name:
            expected, losses, ratio = matched_losses(reference, run)
            table[name]["loss_vs_reference"] = {"reference_steps_averaged": ratio, **loss_difference(expected, losses)}
    return {"reference": reference_name, "runs": table}


def plot(summaries: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, reference_name = runs_and_reference(summaries)
    figure, (curves, differences) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, run in runs.items():
        batch = images_per_step(run)
        losses = step_losses(run)
        curves.plot([batch * (i + 1) for i in range(len(losses))], losses, label=name, linewidth=0.8)
        if name != reference_name:
            expected, losses, _ = matched_losses(runs[reference_name], run)
            images = [batch * (i + 1) for i in range(len(losses))]
            differences.plot(images, [b - a for a, b in zip(expected, losses, strict=True)], label=name, linewidth=0.8)
    curves.set_ylabel("training loss")
    curves.legend(fontsize=7)
    differences.set_ylabel(f"difference to {reference_name}, same images")
    differences.set_xlabel("training images seen")
    differences.legend(fontsize=7)
    differences.axhline(0, color="black", linewidth=0.5)
    figure.tight_layout()
    figure.savefig(out / "loss_curves.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("summaries", nargs="+", type=Path)
    args = parser.parse_args()
    summaries = {path.parent.name: read_json(path) for path in args.summaries}
    result = side_by_side(summaries)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "side_by_side.json").write_text(json.dumps(result, indent=2))
    plot(summaries, args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    run_stage(main)

"""Evaluate the run's best weights on val2017 with rfdetr's own COCO evaluation (the evaluate rule).

The weights are the last block's `best.pth`: rfdetr's `checkpoint_best_total.pth`, the EMA or the regular model,
whichever scored better on validation (its `best_total_source` says which). They are evaluated by rfdetr's
`evaluate()` with COCO's standard protocol (at most 100 detections per image; rfdetr's validation during training
keeps up to 500), on the GPU when the run trained on one, with the run's GPU profile's batch size and precision
(bf16 for the FP8 route, whose Transformer Engine graphs are a training route). Writes:

- `metrics.json`: AP, AP50, AP75, AP small/medium/large, AR@1/10/100, as rfdetr's metric computed them (with the
  `coco_metrics` hook off: what `evaluate()` returns, the others null);
- `per_class.csv`: AP@50:95 per COCO category present in val2017, and a figure of them;
- an HTML page of both, for the report.
"""

from __future__ import annotations

import json
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rfdetr_coco_pipeline.common import StageError, log, read_json, write_json
from rfdetr_coco_pipeline.data.dataset import count_images
from rfdetr_coco_pipeline.hooks import check_hooks
from rfdetr_coco_pipeline.hooks.coco_metrics import SUMMARY_KEYS, captured_coco_metrics, per_class_ap, summary
from rfdetr_coco_pipeline.report_pages import key_values, table, write_page
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.device import detect_device
from rfdetr_coco_pipeline.training.rfdetr_call import AMP_DTYPE, eval_batch_size, load_for_inference

MAX_DETECTIONS = 100  # COCO's standard protocol: AP and AR@100 over the 100 highest-scoring boxes per image
RETURNED = {"AP": "mAP_50_95", "AP50": "mAP_50", "AP75": "mAP_75", "AR100": "mAR"}  # evaluate()'s val/<name>


@dataclass(frozen=True)
class EvaluationFiles:
    metrics: Path
    per_class: Path
    figure: Path
    page: Path


def returned_summary(returned: dict[str, Any]) -> dict[str, float | None]:
    """The summary numbers `evaluate()` returns, under `SUMMARY_KEYS`' names; None for those it does not return."""
    values = {name: returned.get(f"val/{key}") for name, key in RETURNED.items()}
    return {name: None if values.get(name) is None else float(values[name]) for name in SUMMARY_KEYS}


def returned_per_class(returned: dict[str, Any], names: dict[int, str]) -> dict[int, float]:
    """AP per category id from `evaluate()`'s per-class keys (val/AP/<category name>)."""
    ids = {name: category for category, name in names.items()}
    found = {key.removeprefix("val/AP/"): float(value) for key, value in returned.items() if "/AP/" in key}
    return {ids[name]: ap for name, ap in found.items() if name in ids and ap >= 0}


def evaluate_weights(
    weights: Path, run: dict[str, Any], dataset: Path, device_kind: str, workers: int, with_hook: bool = True
) -> tuple[dict[str, Any], dict[int, float]]:
    """rfdetr's COCO evaluation of `weights` on `dataset`/val2017: (summary with provenance, AP per category id).
    `with_hook`: keep rfdetr's whole COCO result through the `coco_metrics` hook; else what `evaluate()` returns."""
    profile = run["profile"]
    precision = "bf16" if profile["precision"] == "fp8" else profile["precision"]
    images = count_images(dataset / "val2017")
    batch = eval_batch_size(images, profile["batch_size"])
    model = load_for_inference(weights)
    kwargs: dict[str, Any] = dict(
        dataset_file="coco",
        dataset_dir=str(dataset),
        batch_size=profile["batch_size"],
        eval_batch_size=batch,
        num_workers=workers,
        amp_dtype=AMP_DTYPE[precision],
        eval_max_dets=MAX_DETECTIONS,
        log_per_class_metrics=True,
        progress_bar="tqdm",
    )
    if device_kind == "cpu":
        kwargs["device"] = "cpu"
    log.info("Evaluating %s on %d images (batch %d, %s, %s)", weights, images, batch, precision, device_kind)
    with tempfile.TemporaryDirectory() as scratch, captured_coco_metrics() if with_hook else nullcontext() as computed:
        returned = model.evaluate(split="val", output_dir=scratch, **kwargs)
    names = category_names(dataset / "annotations" / "instances_val2017.json")
    if with_hook:
        if not computed:
            raise StageError(f"rfdetr's evaluation of {weights} computed no COCO metric; see the log above.")
        numbers, per_class = summary(computed[-1]), per_class_ap(computed[-1])
    else:
        numbers, per_class = returned_summary(returned), returned_per_class(returned, names)
    result = {
        **numbers,
        "images": images,
        "max_detections": MAX_DETECTIONS,
        "weights": str(weights),
        **checkpoint_facts(weights),
        "precision": precision,
        "device": device_kind,
        "rfdetr_returned": {key: float(value) for key, value in returned.items() if "/AP/" not in key},
    }
    return result, per_class


def checkpoint_facts(weights: Path) -> dict[str, Any]:
    """Which model rfdetr kept as best (EMA or regular) and the training step it was saved at."""
    import torch

    checkpoint = torch.load(weights, map_location="cpu", weights_only=False)
    return {"best_source": checkpoint.get("best_total_source"), "saved_at_step": checkpoint.get("global_step")}


def category_names(annotations: Path) -> dict[int, str]:
    with open(annotations) as handle:
        return {int(c["id"]): c["name"] for c in json.load(handle)["categories"]}


def write_per_class(per_class: dict[int, float], names: dict[int, str], csv_path: Path, figure: Path) -> None:
    """per_class.csv (category_id, name, AP; by category id) and a bar chart of the APs, highest first."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    frame = pd.DataFrame(
        [{"category_id": cid, "name": names.get(cid, str(cid)), "AP": ap} for cid, ap in sorted(per_class.items())],
        columns=["category_id", "name", "AP"],
    )
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(csv_path, index=False)
    ordered = frame.sort_values("AP")
    fig, axis = plt.subplots(figsize=(8, max(3, 0.22 * len(ordered) + 1)))
    axis.barh(ordered["name"], ordered["AP"], color="#3b7dd8")
    axis.set_xlabel("AP@50:95 on val2017")
    axis.set_xlim(0, max(0.05, float(ordered["AP"].max()) * 1.1 if len(ordered) else 0))
    axis.set_title(f"AP per category ({len(ordered)} categories)")
    axis.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)
    plt.close(fig)


PROVENANCE = ("weights", "best_source", "saved_at_step", "images", "max_detections", "precision", "device")


def evaluate_run(
    settings: Settings, weights: Path, run_json: Path, dataset: Path, files: EvaluationFiles, workers: int
) -> None:
    """The evaluate stage: evaluate `weights` (the run described by `run_json`) and write `files`."""
    device = detect_device(settings.train.device)
    with_hook = "coco_metrics" not in check_hooks()
    result, per_class = evaluate_weights(
        weights, read_json(run_json), dataset, device.kind, min(workers, settings.train.max_workers), with_hook
    )
    names = category_names(dataset / "annotations" / "instances_val2017.json")
    write_per_class(per_class, names, files.per_class, files.figure)
    write_json(files.metrics, result)
    write_page(
        files.page,
        "Evaluation on val2017",
        [
            ("COCO metrics of the best weights", table([{key: result[key] for key in SUMMARY_KEYS}])),
            ("What was evaluated", key_values({key: result[key] for key in PROVENANCE})),
            ("AP@50:95 per category", table(pd.read_csv(files.per_class))),
        ],
    )
    log.info("AP %.4f, AP50 %.4f (%s)", result["AP"], result["AP50"], files.metrics)

"""Evaluate the run's best weights on val2017 with rfdetr's own COCO evaluation (the evaluate rule).

The weights are the last block's `best.pth`: rfdetr's `checkpoint_best_total.pth`, the EMA or the regular model,
whichever scored better on validation (its `best_total_source` says which). They are evaluated by rfdetr's
`evaluate()` with COCO's standard protocol (at most 100 detections per image; rfdetr's validation during training
keeps up to 500), on the GPU when the run trained on one, with the run's GPU profile's batch size and precision
(bf16 for the FP8 route, whose Transformer Engine graphs are a training route). Writes:

- `metrics.json`: AP, AP50, AP75, AP small/medium/large, AR@1/10/100, as rfdetr's metric computed them;
- `per_class.csv`: AP@50:95 per COCO category present in val2017;
- a figure of the per-class APs.

Shown by `tests/test_pipeline.py::test_the_evaluation_is_rfdetrs_coco_summary_and_per_class_ap_of_the_best_weights`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.common import StageError, log, pipeline_config, read_json, run_main, write_json
from pipeline.dataset import count_images
from pipeline.gpu_profiles import detect_device
from pipeline.report_pages import key_values, table, write_page
from pipeline.rfdetr_call import AMP_DTYPE, eval_batch_size, load_for_inference
from rfdetr_extensions.evaluation import SUMMARY_KEYS, captured_coco_metrics, per_class_ap, summary

MAX_DETECTIONS = 100  # COCO's standard protocol: AP and AR@100 over the 100 highest-scoring boxes per image


def evaluate_weights(
    weights: Path, run: dict[str, Any], dataset: Path, device_kind: str, workers: int
) -> tuple[dict[str, Any], dict[int, float]]:
    """rfdetr's COCO evaluation of `weights` on `dataset`/val2017: (summary with provenance, AP per category id)."""
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
    with tempfile.TemporaryDirectory() as scratch, captured_coco_metrics() as computed:
        returned = model.evaluate(split="val", output_dir=scratch, **kwargs)
    if not computed:
        raise StageError(f"rfdetr's evaluation of {weights} computed no COCO metric; see the log above.")
    metrics = computed[-1]
    checkpoint = _checkpoint_facts(weights)
    result = {
        **summary(metrics),
        "images": images,
        "max_detections": MAX_DETECTIONS,
        "weights": str(weights),
        **checkpoint,
        "precision": precision,
        "device": device_kind,
        "rfdetr_returned": {key: float(value) for key, value in returned.items() if "/AP/" not in key},
    }
    return result, per_class_ap(metrics)


def _checkpoint_facts(weights: Path) -> dict[str, Any]:
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

    table = pd.DataFrame(
        [{"category_id": cid, "name": names.get(cid, str(cid)), "AP": ap} for cid, ap in sorted(per_class.items())]
    )
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv_path, index=False)
    ordered = table.sort_values("AP")
    fig, axis = plt.subplots(figsize=(8, max(3, 0.22 * len(ordered) + 1)))
    axis.barh(ordered["name"], ordered["AP"], color="#3b7dd8")
    axis.set_xlabel("AP@50:95 on val2017")
    axis.set_xlim(0, max(0.05, float(ordered["AP"].max()) * 1.1))
    axis.set_title(f"AP per category ({len(ordered)} categories)")
    axis.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, type=Path, help="the last block's best.pth")
    parser.add_argument("--run", required=True, type=Path, help="the last block's run.json (its GPU profile)")
    parser.add_argument("--dataset", required=True, type=Path, help="the verified dataset (val2017/, annotations/)")
    parser.add_argument("--metrics", required=True, type=Path)
    parser.add_argument("--per-class", required=True, type=Path)
    parser.add_argument("--figure", required=True, type=Path)
    parser.add_argument(
        "--page", required=True, type=Path, help="HTML: the metrics and per-class tables, for the report"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    train = pipeline_config()["train"]
    device = detect_device(train["device"])
    result, per_class = evaluate_weights(
        args.weights, read_json(args.run), args.dataset, device.kind, min(args.workers, train["max_workers"])
    )
    names = category_names(args.dataset / "annotations" / "instances_val2017.json")
    write_per_class(per_class, names, args.per_class, args.figure)
    write_json(args.metrics, result)
    write_page(
        args.page,
        "Evaluation on val2017",
        [
            ("COCO metrics of the best weights", table([{k: result[k] for k in SUMMARY_KEYS}])),
            (
                "What was evaluated",
                key_values(
                    {
                        k: result[k]
                        for k in (
                            "weights",
                            "best_source",
                            "saved_at_step",
                            "images",
                            "max_detections",
                            "precision",
                            "device",
                        )
                    }
                ),
            ),
            ("AP@50:95 per category", table(pd.read_csv(args.per_class))),
        ],
    )
    log.info("AP %.4f, AP50 %.4f, AR@100 %.4f (%s)", result["AP"], result["AP50"], result["AR100"], args.metrics)


if __name__ == "__main__":
    run_main(main)

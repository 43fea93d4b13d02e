"""The wall time of the 40-epoch COCO run, projected from one measured run of the train stage (`bench.compare`).

usage: python -m bench.projection SUMMARY.json --run NAME --measured-val-images N
           [--cold-start-seconds S | --cold COLD_SUMMARY.json --cold-run NAME]
           [--validation VALIDATION.json] [--train-images 118287] [--val-images 5000] [--epochs 40]
           [--epochs-per-block 10]

From the run's epochs after the first: training images/s, and validation seconds per image (N images were
validated each epoch); from its first epoch: the extra seconds a block's start costs (epoch-0 overhead and the first
validation's extra time, with the compile caches that run had). A cold first block costs more than that: give it as
`--cold-start-seconds`, or measure it with `--cold`, a run of the same row on the same set that started on empty
compile caches (`bench/gpu_run.sh route` with `SHARE_CACHE=1`, run twice: the first is cold, the second warm): its
first-epoch extras less the warm run's. `--validation` takes the validation time from a `bench.validation` run
instead (its validations after the first, each of `--val-images` images: COCO's 5,000 measured as they are, rather
than scaled from a smaller set, which also scales the fixed costs of each validation). Prints the inputs beside the
result, as JSON. Arithmetic, not a COCO run: the loader's cost at COCO's image sizes is whatever the measured runs'
images cost. Tests: tests/test_bench.py::test_the_projection_adds_epochs_at_the_measured_rates_and_each_blocks_start,
tests/test_bench.py::test_the_cold_start_is_the_cold_runs_first_epoch_extras_less_the_warm_runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline.blocks import block_ranges
from pipeline.common import read_json, run_main


def first_epoch_extra_seconds(run: dict[str, Any]) -> float:
    """What a run's first epoch cost beyond a steady one: its epoch-0 overhead and its first validation's extra."""
    later = run["records"][1:]
    steady_validation = sum(r["val_seconds"] for r in later) / len(later) if later else 0.0
    return run["epoch0_overhead_seconds"] + run["first_validation_seconds"] - steady_validation


def cold_start_seconds(cold: dict[str, Any], warm: dict[str, Any]) -> float:
    """The extra seconds of a block that starts on empty compile caches: the cold run's first-epoch extras less the
    warm run's (both runs of one row on one set)."""
    return round(first_epoch_extra_seconds(cold) - first_epoch_extra_seconds(warm), 1)


def project(
    run: dict[str, Any],
    measured_val_images: int,
    train_images: int = 118_287,
    val_images: int = 5_000,
    epochs: int = 40,
    epochs_per_block: int = 10,
    cold_start_seconds: float = 0.0,
    validation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The projected hours and the measured inputs they come from (see the module's text)."""
    later = run["records"][1:]
    if not later:
        raise ValueError("the run needs at least two epochs: the first pays the start, the others give the rates")
    steady = sum(r["images"] for r in later) / sum(r["train_seconds"] for r in later)
    val_per_image = sum(r["val_seconds"] for r in later) / (len(later) * measured_val_images)
    block_start = first_epoch_extra_seconds(run)
    blocks = len(block_ranges(epochs, epochs_per_block))
    val_seconds = val_images * val_per_image
    if validation is not None:
        warm = validation["validations"][1:]
        if not warm or any(record["images"] != val_images for record in warm):
            raise ValueError(f"--validation needs validations after the first, each of {val_images} images")
        val_seconds = sum(record["seconds"] for record in warm) / len(warm)
    epoch_seconds = train_images / steady + val_seconds
    total = epochs * epoch_seconds + blocks * block_start + cold_start_seconds
    return {
        "inputs": {
            "steady_train_images_per_second": round(steady, 1),
            "validation_seconds_per_image": round(val_per_image, 5),
            "validation_seconds": round(val_seconds, 2),
            "validation_from": "bench.validation" if validation is not None else "the run, scaled per image",
            "block_start_extra_seconds": round(block_start, 1),
            "cold_start_seconds": cold_start_seconds,
            "train_images": train_images,
            "val_images": val_images,
            "epochs": epochs,
            "blocks": blocks,
        },
        "epoch_seconds": round(epoch_seconds, 1),
        "projected_hours": round(total / 3600, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summary", type=Path, help="a bench.compare summary.json")
    parser.add_argument("--run", required=True, help="the run in it (its name in bench.compare)")
    parser.add_argument("--measured-val-images", required=True, type=int)
    cold = parser.add_mutually_exclusive_group()
    cold.add_argument("--cold-start-seconds", type=float, default=0.0)
    cold.add_argument("--cold", type=Path, help="a bench.compare summary.json of the same row's cold run")
    parser.add_argument("--cold-run", help="the cold run's name in --cold")
    parser.add_argument("--validation", type=Path, help="a bench.validation output of --val-images images")
    parser.add_argument("--train-images", type=int, default=118_287)
    parser.add_argument("--val-images", type=int, default=5_000)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--epochs-per-block", type=int, default=10)
    args = parser.parse_args()
    run = read_json(args.summary)[args.run]
    if args.cold is not None:
        if not args.cold_run:
            parser.error("--cold needs --cold-run, the cold run's name in that summary")
        args.cold_start_seconds = cold_start_seconds(read_json(args.cold)[args.cold_run], run)
    result = project(
        run,
        args.measured_val_images,
        args.train_images,
        args.val_images,
        args.epochs,
        args.epochs_per_block,
        args.cold_start_seconds,
        read_json(args.validation) if args.validation else None,
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    run_main(main)

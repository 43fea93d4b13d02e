"""The wall time of the 40-epoch COCO run, projected from one measured run of the train stage (`bench.compare`).

usage: python -m bench.projection SUMMARY.json --run NAME --measured-val-images N
           [--cold-start-seconds S | --cold COLD_SUMMARY.json --cold-run NAME]
           [--validation VALIDATION.json|epochs.jsonl] [--train-images 118287] [--val-images 5000] [--epochs 40]
           [--epochs-per-block 10]

The run is one training job (one block) of two or more epochs. From its epochs after the first: the training
rate of the steps past each epoch's start (bench.compare's mid-epoch images/s, from EpochLog's `step_seconds`), each
epoch's start (its training seconds beyond its images at that rate: the loader's first batches, the first steps),
validation seconds per image (N images were validated each epoch), and the seconds between two epochs (the previous
epoch's checkpoints, EpochLog's `since_previous_epoch_seconds`). Each projected epoch pays one start, its images at
the rate, its validation and one wait between epochs, so a block of ten epochs pays ten checkpoints where the
measured block of two paid two, and a COCO epoch ten times the benchmark set's pays its start once, not ten times.
Where the records predate `step_seconds` or `since_previous_epoch_seconds`, the rate is whole epochs' and the start
or the wait is 0, as the printed inputs say. From its whole job (Snakemake's benchmark of
`train/block_01`): what a block costs beyond its epochs at that steady pace, its fixed cost. That is the job's start
(process, staging, model build), its epoch-0 overhead (compile, CUDA graph recording), its first validation's extra
and its end (checkpoints, exit). Each block of the projected run pays it once, with the compile caches the measured
run had.

The measured job also copied the set to the RAM disk, which a real run does once: its later blocks reuse the copy.
`--stage-seconds` (default: the run's own `stage_seconds`, else 0) takes that copy off every block but the first.

A first block on empty caches pays more: give that as `--cold-start-seconds`, or measure it with `--cold`, a run of
the same row on the same set whose caches were empty, or filled by the compile warm-up (`bench/gpu_run.sh route`
with `SHARE_CACHE=1`, run twice: the first is cold, the second warm). The cold start is the cold run's fixed cost
less the warm run's, both at the warm run's pace, so the cold run may be one epoch long.

The notebook is projected from bench.compare's stock run the same way, with one difference: it trains every epoch
in one process, so its fixed cost (the process's wall time, `wall_seconds`, less its epochs at the steady pace: imports,
datasets, the compile and the eval graph's compile) counts once, and it copies nothing to a RAM disk. A summary's
run is the notebook's when it has no Snakemake job times.

`--validation` takes the validation time from a run that validated `--val-images` images each epoch instead
(COCO's 5,000 measured as they are, rather than scaled from a smaller set, whose first batch's wait would be scaled
with it): its validations after the first, from a `bench.validation` output, or from an `epochs.jsonl` of
`EpochLog` (the notebook's run in bench.compare: its records do not count validation images, so the command line
vouches for them). Prints the inputs beside the result, as JSON. Arithmetic, not a COCO run: the loader's cost at
COCO's image sizes is whatever the measured runs' images cost. Tests:
tests/test_bench.py::test_the_projection_adds_epochs_at_the_measured_rates_and_each_blocks_fixed_cost,
tests/test_bench.py::test_each_epochs_start_is_paid_once_however_many_images_the_epoch_has,
tests/test_bench.py::test_the_cold_start_is_the_cold_runs_fixed_cost_less_the_warm_runs,
tests/test_bench.py::test_the_notebook_is_projected_as_one_process_that_pays_its_fixed_cost_once,
tests/test_bench.py::test_a_validation_of_cocos_size_comes_from_bench_validation_or_an_epoch_log.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NamedTuple

from bench.compare import mid_epoch_images_per_second
from rfdetr_coco_pipeline.blocks import block_ranges
from rfdetr_coco_pipeline.common import read_json, run_stage

TRAIN_JOB = "train/block_01"


class Rates(NamedTuple):
    """A measured run's pace over its epochs after the first."""

    train_images_per_second: float  # mid-epoch where step times are recorded, else whole epochs'
    epoch_start_seconds: float | None  # each epoch's training seconds beyond its images at that rate (None: 0)
    validation_seconds_per_image: float
    seconds_between_epochs: float | None  # the previous epoch's checkpoints (None: not recorded, 0)

    def epoch_train_seconds(self, images: float) -> float:
        return (self.epoch_start_seconds or 0.0) + images / self.train_images_per_second

    def epoch_seconds(self, images: float, val_seconds: float) -> float:
        return self.epoch_train_seconds(images) + val_seconds + (self.seconds_between_epochs or 0.0)


def steady_rates(run: dict[str, Any], measured_val_images: int) -> Rates:
    """The run's `Rates` over its epochs after the first."""
    later = run["records"][1:]
    if not later:
        raise ValueError("the run needs at least two epochs: the first pays the start, the others give the rates")
    train_seconds = sum(r["train_seconds"] for r in later)
    rate = mid_epoch_images_per_second(later)
    start = None
    if rate is None:
        rate = sum(r["images"] for r in later) / train_seconds
    else:
        start = (train_seconds - sum(r["images"] for r in later) / rate) / len(later)
    gaps = [r["since_previous_epoch_seconds"] for r in later if r.get("since_previous_epoch_seconds") is not None]
    between = sum(gaps) / len(gaps) if gaps else None
    val_per_image = sum(r["val_seconds"] for r in later) / (len(later) * measured_val_images)
    return Rates(rate, start, val_per_image, between)


def read_validation(path: Path) -> dict[str, Any]:
    """A `--validation` file: a bench.validation output as it is, or an EpochLog
    `epochs.jsonl`, whose validations are taken to be of `--val-images` images each (marked `images: None`)."""
    if path.suffix != ".jsonl":
        return read_json(path)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {"validations": [{"images": None, "seconds": r["val_seconds"]} for r in records], "from": "epochs.jsonl"}


def is_notebook(run: dict[str, Any]) -> bool:
    """Whether `run` is bench.compare's stock run (the notebook's recipe in one process), which has no Snakemake
    job times, rather than the workflow's."""
    return "job_seconds" not in run and "wall_seconds" in run


def job_seconds(run: dict[str, Any]) -> float:
    """The measured job's wall seconds: the workflow's train job (Snakemake's benchmark of TRAIN_JOB) or the
    notebook's whole process."""
    if is_notebook(run):
        return run["wall_seconds"]
    if TRAIN_JOB not in run.get("job_seconds", {}):
        raise ValueError(f"the run has no {TRAIN_JOB} job time: project from a one-block run of bench.compare")
    return run["job_seconds"][TRAIN_JOB]


def block_fixed_seconds(run: dict[str, Any], measured_val_images: int, rates: Rates | None = None) -> float:
    """The job's wall seconds less its epochs at the steady pace, each with the seconds between two epochs (the
    run's own, or `rates`): what a block (the notebook: its one process) costs once, whatever its length. The
    measured job's last epoch has no next one, so its checkpoints stay in this fixed cost, as a block's last
    epoch's do."""
    rates = rates or steady_rates(run, measured_val_images)
    val_seconds = measured_val_images * rates.validation_seconds_per_image
    paced = sum(rates.epoch_seconds(r["images"], val_seconds) for r in run["records"])
    return job_seconds(run) - paced


def cold_start_seconds(cold: dict[str, Any], warm: dict[str, Any], measured_val_images: int) -> float:
    """The extra seconds of a first block on empty (or warm-up-filled) compile caches: the cold run's fixed cost
    less the warm run's (both one-block runs of one row on one set), both at the warm run's steady pace, so the cold
    run may be a single epoch."""
    rates = steady_rates(warm, measured_val_images)
    cold_fixed = block_fixed_seconds(cold, measured_val_images, rates)
    return round(cold_fixed - block_fixed_seconds(warm, measured_val_images, rates), 1)


def project(
    run: dict[str, Any],
    measured_val_images: int,
    train_images: int = 118_287,
    val_images: int = 5_000,
    epochs: int = 40,
    epochs_per_block: int = 10,
    cold_start_seconds: float = 0.0,
    validation: dict[str, Any] | None = None,
    stage_seconds: float | None = None,
) -> dict[str, Any]:
    """The projected hours and the measured inputs they come from (see the module's text)."""
    rates = steady_rates(run, measured_val_images)
    block_fixed = block_fixed_seconds(run, measured_val_images, rates)
    notebook = is_notebook(run)
    blocks = 1 if notebook else len(block_ranges(epochs, epochs_per_block))
    val_seconds = val_images * rates.validation_seconds_per_image
    if validation is not None:
        warm = validation["validations"][1:]
        if not warm or any(record["images"] not in (val_images, None) for record in warm):
            raise ValueError(f"--validation needs validations after the first, each of {val_images} images")
        val_seconds = sum(record["seconds"] for record in warm) / len(warm)
    epoch_seconds = rates.epoch_seconds(train_images, val_seconds)
    copy = (run.get("stage_seconds") or 0.0) if stage_seconds is None else stage_seconds
    total = epochs * epoch_seconds + blocks * block_fixed - (blocks - 1) * copy + cold_start_seconds
    return {
        "inputs": {
            "steady_train_images_per_second": round(rates.train_images_per_second, 1),
            "train_images_per_second_from": "whole epochs (no step times recorded)"
            if rates.epoch_start_seconds is None
            else "mid-epoch steps",
            "epoch_start_seconds": "not recorded: counted as 0"
            if rates.epoch_start_seconds is None
            else round(rates.epoch_start_seconds, 2),
            "validation_seconds_per_image": round(rates.validation_seconds_per_image, 5),
            "validation_seconds": round(val_seconds, 2),
            "seconds_between_epochs": "not recorded: counted as 0"
            if rates.seconds_between_epochs is None
            else round(rates.seconds_between_epochs, 2),
            "validation_from": validation.get("from", "bench.validation")
            if validation
            else "the run, scaled per image",
            "measured_job": "the notebook's process" if notebook else TRAIN_JOB,
            "measured_job_seconds": job_seconds(run),
            "block_fixed_seconds": round(block_fixed, 1),
            "of_which_epoch0_overhead_seconds": run["epoch0_overhead_seconds"],
            "of_which_stage_copy_seconds": copy,
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
    parser.add_argument(
        "--validation", type=Path, help="validations of --val-images images: bench.validation's output, epochs.jsonl"
    )
    parser.add_argument("--stage-seconds", type=float, help="the run's copy to the RAM disk (default: its own)")
    parser.add_argument("--train-images", type=int, default=118_287)
    parser.add_argument("--val-images", type=int, default=5_000)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--epochs-per-block", type=int, default=10)
    args = parser.parse_args()
    run = read_json(args.summary)[args.run]
    if args.cold is not None:
        if not args.cold_run:
            parser.error("--cold needs --cold-run, the cold run's name in that summary")
        cold_run = read_json(args.cold)[args.cold_run]
        args.cold_start_seconds = cold_start_seconds(cold_run, run, args.measured_val_images)
    result = project(
        run,
        args.measured_val_images,
        args.train_images,
        args.val_images,
        args.epochs,
        args.epochs_per_block,
        args.cold_start_seconds,
        read_validation(args.validation) if args.validation else None,
        args.stage_seconds,
    )
    if args.cold is not None and "train/compile_warmup" in cold_run["job_seconds"]:
        # beside the train2017 download in a real first run, so not added to the total: shown for the reader
        result["inputs"]["cold_run_compile_warmup_seconds"] = cold_run["job_seconds"]["train/compile_warmup"]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    run_stage(main)

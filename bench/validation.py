"""Where the train stage's validation spends its time, phase by phase, on the GPU it runs on.

usage: python -m bench.validation --dataset DIR --out FILE.json [--epochs 3] [--speedups all|none|NAME,...|all,-NAME]
           [--workers 16] [--profile auto|NAME] [--eager] [--state DIR] [--whole] [--eval-batch N] [--trace FILE]

Trains `--epochs` epochs through the train stage's own rfdetr call (`training.rfdetr_call.run_rfdetr`: config.yaml's
recipe and GPU profile, the selected speedups), so validation runs exactly as in a workflow run. Use a set with few
training images and many validation images (`bench/synth_coco.py DIR 1024 5000`): then most of the time is
validation. Two Lightning callbacks, one before and one after every other callback, wait for the GPU at each
phase's edges and time, per validation:

- `loader`: from the end of one batch to the start of the next (the loader, the copy to the GPU, Lightning);
- `forward`: rfdetr's `validation_step` (the EMA model's forward pass and post-processing);
- `batch_callbacks`: the callbacks' batch end: rfdetr's COCO metric update and F1 matching;
- `epoch_end`: the callbacks' epoch end: the COCO evaluation, the F1 sweep, the logs;
- `validation_end`: what runs after it (rfdetr's best-model checkpoint);
- `seconds`, `images_per_second`: the whole validation, start to end.

The waits add a little time that a normal run overlaps, so the sum is an upper bound of each phase; the train
stage's own figure is `val_seconds` in its `epochs.jsonl`. `--whole` waits for the GPU only at each validation's
start and end: its phases stay 0 and `seconds` is what a run without the clocks takes (the waits at the phases'
edges keep the GPU from running ahead of the host, which a normal run allows).
`--trace FILE` runs the second validation under torch.profiler and writes its trace to FILE (`.trace.json.gz`;
read it with `python -m bench.trace_ops FILE --steps 1`: GPU busy, host operations, GPU idle stretches).
Writes one record per validation to `--out` and prints them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import yaml

from rfdetr_coco_pipeline.common import log, run_stage, write_json
from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.recipe import run_recipe
from rfdetr_coco_pipeline.training.rfdetr_call import configure_compile_cache, run_rfdetr, train_kwargs
from rfdetr_coco_pipeline.training.route import settle_route
from rfdetr_coco_pipeline.versions import package_version

PHASES = ("loader", "forward", "batch_callbacks", "epoch_end", "validation_end")


class PhaseRecord:
    """The current validation's phase seconds and images, and every finished validation's record."""

    def __init__(self, phases: bool = True) -> None:
        self.phases = phases  # False: time each validation as a whole, without waiting at the phases' edges
        self.records: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        self.mark = 0.0

    def now(self) -> float:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self, epoch: int) -> None:
        self.current = {"epoch": epoch, "images": 0, "batches": 0, **dict.fromkeys(PHASES, 0.0)}
        self.started = self.mark = self.now()

    def close(self, phase: str) -> None:
        """Add the time since the last mark to `phase` and mark now."""
        if not self.phases:
            return
        now = self.now()
        self.current[phase] += now - self.mark
        self.mark = now

    def finish(self) -> None:
        if self.phases:
            self.close("validation_end")
        else:
            self.mark = self.now()
        record = {k: round(v, 3) if isinstance(v, float) else v for k, v in self.current.items()}
        record["seconds"] = round(self.mark - self.started, 3)
        record["images_per_second"] = round(record["images"] / max(record["seconds"], 1e-9), 1)
        self.records.append(record)
        log.info("validation phases: %s", json.dumps(record))


class PhaseClockFirst(pl.Callback):
    """Goes first in the Trainer's callback list: opens a validation's record, closes its `loader` phase at each
    batch's start (counting the batch's images) and its `forward` phase at each batch's end."""

    def __init__(self, record: PhaseRecord) -> None:
        self.record = record

    def on_validation_epoch_start(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking:
            self.record.start(trainer.current_epoch)

    def on_validation_batch_start(self, trainer: Any, module: Any, batch: Any, *args: Any) -> None:
        if self.record.current and not trainer.sanity_checking:
            self.record.close("loader")
            images = batch[0]
            self.record.current["images"] += int(getattr(images, "tensors", images).shape[0])
            self.record.current["batches"] += 1

    def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
        if self.record.current and not trainer.sanity_checking:
            self.record.close("forward")

    def on_validation_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.record.current and not trainer.sanity_checking:
            self.record.close("loader")  # the wait for the loader to say it has no more batches


class PhaseClockLast(pl.Callback):
    """Goes last in the Trainer's callback list: closes the `batch_callbacks` and `epoch_end` phases, and finishes
    the validation's record at its end."""

    def __init__(self, record: PhaseRecord) -> None:
        self.record = record

    def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
        if self.record.current and not trainer.sanity_checking:
            self.record.close("batch_callbacks")

    def on_validation_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.record.current and not trainer.sanity_checking:
            self.record.close("epoch_end")

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if self.record.current and not trainer.sanity_checking:
            self.record.finish()
            self.record.current = {}


class ProfileOneValidation(pl.Callback):
    """Runs validation number `validation` (0: the first after the sanity check) under torch.profiler and writes its
    chrome trace to `trace` (gzipped when it ends in .gz). Shown by
    `tests/test_bench.py::test_the_validation_profiler_traces_only_the_second_validation`."""

    def __init__(self, trace: Path, validation: int = 1) -> None:
        self.trace = trace
        self.validation = validation
        self.seen = 0
        self.profiler: Any = None

    def on_validation_epoch_start(self, trainer: Any, module: Any) -> None:
        import torch

        if trainer.sanity_checking:
            return
        if self.seen == self.validation:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.start()
        self.seen += 1

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        import torch

        if self.profiler is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.profiler.stop()
            self.profiler.export_chrome_trace(str(self.trace))
            log.info("validation trace: %s", self.trace)
            self.profiler = None


@contextmanager
def clocked_trainer(record: PhaseRecord, trace: Path | None = None) -> Iterator[None]:
    """Every Trainer rfdetr builds in this block gets the phase clocks first and last in its callback list (and,
    with `trace`, the profiler of one validation right after the first clock)."""
    first, last = PhaseClockFirst(record), PhaseClockLast(record)
    extra = [ProfileOneValidation(trace)] if trace else []

    def wrap(original: Any) -> Any:
        def build_trainer(*args: Any, **kwargs: Any) -> Any:
            trainer = original(*args, **kwargs)
            trainer.callbacks[0:0] = [first, *extra]
            trainer.callbacks.append(last)
            return trainer

        return build_trainer

    with patch_rfdetr("rfdetr.training", "build_trainer", wrap):
        yield


def main() -> None:
    from bench.profile_steps import parse_speedups

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--speedups", type=parse_speedups, default="all", help="none, all, NAME,NAME or all,-NAME,+NAME"
    )
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--profile", default="auto", help="a gpu_profiles row of config.yaml, or auto")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: to try the tool out")
    parser.add_argument("--eager", action="store_true", help="the profile without compile and CUDA graphs")
    parser.add_argument("--state", type=Path, help="rfdetr's output folder (default: beside --out)")
    parser.add_argument("--whole", action="store_true", help="time each validation as a whole, no phase clocks")
    parser.add_argument("--eval-batch", type=int, help="the validation batch (default: the train stage's choice)")
    parser.add_argument("--trace", type=Path, help="profile the second validation, its trace to this .json.gz")
    args = parser.parse_args()

    config = yaml.safe_load(Path("config.yaml").read_text())
    train = {"epochs": args.epochs, "speedups": args.speedups, "device": args.device, "profile": args.profile}
    settings = Settings.from_config({**config, "train": {**config["train"], **train}})
    version = package_version("rfdetr")
    route = settle_route(settings, version)
    if args.eager:  # no compile: minutes less per run, the same validation code around the model
        eager = {"compile": False, "cuda_graphs": False, "name": f"{route.profile.name}-eager"}
        route = replace(route, profile=route.profile.model_copy(update=eager))
    speedups, profile = route.speedups, route.profile
    recipe = run_recipe(settings.recipe, profile, version)
    state_dir = args.state or args.out.parent / f"{args.out.stem}-state"
    state_dir.mkdir(parents=True, exist_ok=True)
    configure_compile_cache(state_dir)
    kwargs = train_kwargs(recipe, route, Path(args.dataset), state_dir, args.workers)
    if args.eval_batch:
        kwargs["eval_batch_size"] = args.eval_batch
        log.info("Validation batch: %d images (--eval-batch)", args.eval_batch)
    log.info("GPU profile %s (%s); speedups: %s", profile.name, route.reason, ", ".join(speedups.names()) or "none")
    record = PhaseRecord(phases=not args.whole)
    with clocked_trainer(record, args.trace):
        run_rfdetr(settings, route, kwargs, args.epochs)
    write_json(
        args.out,
        {
            "profile": profile.model_dump(),
            "speedups": speedups.names(),
            "eval_batch_size": kwargs["eval_batch_size"],
            "validations": record.records,
        },
    )
    for row in record.records:
        print(json.dumps(row))


if __name__ == "__main__":
    run_stage(main)

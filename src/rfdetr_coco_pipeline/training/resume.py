"""Resuming a training run, and the bookkeeping of its blocks.

A run's state folder (`results/train/state/<recipe id>/`, rfdetr's `output_dir`) is not a Snakemake output, so a
failed or killed job cannot delete it: rfdetr rewrites `last.ckpt` there every epoch and the next job resumes from
it, losing at most the epoch in flight. A damaged `last.ckpt` is kept aside and the block resumes from the newest
good checkpoint instead: the epoch before it (`previous.ckpt`), else the previous block's, else the start. At the
end of a block its checkpoint, best weights, metrics and timings are copied into the block's output folder, which the
next block (and the plot) reads.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rfdetr_coco_pipeline.common import StageError, log, read_json, write_json
from rfdetr_coco_pipeline.locks import HELD, no_locks_error
from rfdetr_coco_pipeline.training.recipe import recipe_diff

STATE_FILES_KEPT = ("recipe.json", ".training.lock")  # what a fresh start leaves in the state folder
DAMAGED = "*.damaged-*.ckpt"  # an in-progress checkpoint that did not load, kept aside for the user
PREVIOUS = "previous.ckpt"  # the epoch before last.ckpt's (see training/checkpoints.py)


@dataclass(frozen=True)
class ResumePlan:
    checkpoint: Path | None  # None: start from scratch
    next_epoch: int  # first epoch to train (== end: the block is already trained)
    note: str


def checkpoint_epoch(path: Path) -> int:
    """The last completed epoch (0-based) stored in a Lightning checkpoint."""
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["epoch"])


def in_progress_epoch(state_last: Path, set_aside: bool = True) -> int | None:
    """The completed epoch of an in-progress checkpoint of the state folder; None when there is none, or when it
    does not load. A damaged one is renamed `<name>.damaged-<UTC time>.ckpt` (by the main rank, `set_aside`) and the
    log says so."""
    if not state_last.is_file():
        return None
    try:
        return checkpoint_epoch(state_last)
    except Exception as error:  # a cut zip archive, a truncated pickle, a checkpoint without its epoch: all damage
        if not set_aside:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        kept = state_last.with_name(f"{state_last.stem}.damaged-{stamp}.ckpt")
        os.replace(state_last, kept)
        log.warning(
            "The in-progress checkpoint %s does not load (%s: %s): kept aside as %s. The block resumes from the "
            "newest good checkpoint instead: the epoch before (%s), the previous block's, or the start.",
            state_last,
            type(error).__name__,
            str(error)[:200],
            kept.name,
            PREVIOUS,
        )
        return None


def newest_state_checkpoint(state_dir: Path, set_aside: bool = True) -> tuple[Path, int | None]:
    """The state folder's newest checkpoint that loads, and its completed epoch: `last.ckpt`, else the one it
    replaced (`previous.ckpt`); (last.ckpt, None) when neither does."""
    last = state_dir / "last.ckpt"
    for candidate in (last, state_dir / PREVIOUS):
        epoch = in_progress_epoch(candidate, set_aside)
        if epoch is not None:
            return candidate, epoch
    return last, None


def plan_resume(state_last: Path, state_epoch: int | None, previous: Path | None, start: int, end: int) -> ResumePlan:
    """Where block [start, end) continues from.

    `state_last`/`state_epoch`: the state folder's in-progress checkpoint and its completed epoch (None when
    there is none); `previous`: the previous block's checkpoint (None for the first block).
    """
    if state_epoch is not None and start < state_epoch + 1 <= end:
        done = state_epoch + 1
        if done == end:
            return ResumePlan(state_last, end, f"epochs up to {end} are already trained in {state_last}")
        return ResumePlan(state_last, done, f"resuming the interrupted block from {state_last} at epoch {done + 1}")
    if start == 0:
        return ResumePlan(None, 0, "starting from scratch")
    if previous is None:
        raise StageError(f"Block starting at epoch {start} has no previous checkpoint to resume from.")
    return ResumePlan(previous, start, f"resuming from the previous block's checkpoint {previous}")


def copy_metric_rows(source: Path, target: Path, keep: Callable[[int], bool]) -> int:
    """Write the rows of rfdetr's metrics.csv `source` whose epoch `keep` accepts to `target` (which may be
    `source` itself); returns how many rows were kept."""
    with open(source, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames or [], [row for row in reader if keep(int(row["epoch"]))]
    with open(target, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def truncate_metrics(metrics: Path, next_epoch: int) -> None:
    """Drop metrics.csv rows of epochs that will be trained again (rfdetr appends to the file on resume)."""
    if metrics.is_file():
        copy_metric_rows(metrics, metrics, lambda epoch: epoch < next_epoch)


def read_epoch_log(path: Path, start: int, end: int) -> list[dict[str, Any]]:
    """The newest timing record of every epoch in [start, end) from the state folder's epochs.jsonl."""
    latest: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if start <= record["epoch"] < end:
                    latest[record["epoch"]] = record
    return [latest[e] for e in sorted(latest)]


def check_previous_block(previous_block: Path, recipe: Mapping[str, Any], run_id: str) -> Path:
    """The previous block's checkpoint, provided it was trained under this very recipe."""
    previous_run = read_json(previous_block / "run.json")
    if previous_run["recipe_id"] != run_id:
        raise StageError(
            f"The previous block ({previous_block}) was trained under another recipe "
            f"({recipe_diff(previous_run['recipe'], recipe)}); checkpoints made under another recipe are "
            "never resumed. To continue it, restore its settings (pin its GPU profile with "
            f"train.profile: {previous_run['profile']['name']}); to start over under the new recipe, run "
            "snakemake --cores all --forcerun train_block."
        )
    return previous_block / "checkpoint.ckpt"


def lock_state(state_dir: Path) -> int:
    """One training process per state folder: a POSIX lock on `.training.lock`, held until this process ends (the
    returned descriptor must stay open). The kernel drops it when its holder dies, however it dies, and the loader's
    forked workers do not inherit it, so it never outlives the process that took it; a second process (an earlier
    job still running, a second run of the workflow) stops at once."""
    fd = os.open(state_dir / ".training.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno not in HELD:
            raise no_locks_error(state_dir, error, "results_dir") from error
        raise StageError(
            f"Another training process is using {state_dir} (an earlier job that is still running, or a second "
            "snakemake in this folder). Wait for it to end or stop it, then run snakemake again."
        ) from error
    return fd


def prepare_state(state_dir: Path, plan: ResumePlan) -> None:
    """A fresh start empties the state folder of an earlier run under this recipe; a resume drops the metrics rows
    of the epochs it trains again."""
    if plan.checkpoint is None:
        for stale in state_dir.glob("*"):
            if stale.name not in STATE_FILES_KEPT and not stale.match(DAMAGED):
                stale.unlink() if stale.is_file() else shutil.rmtree(stale)
    truncate_metrics(state_dir / "metrics.csv", plan.next_epoch)


COMPILED_MODULE_PREFIX = "_orig_mod."  # torch.compile's wrapper names the wrapped module's parameters under it


def copy_best_weights(source: Path, dest: Path) -> int:
    """Copy rfdetr's best weights (`checkpoint_best_total.pth`) to `dest` in a form `RFDETR.from_checkpoint` loads;
    return how many weight names were changed.

    rfdetr's EMA model is a copy of the Lightning module, whose model a compiled run (the GPU profiles with
    `compile: true`) holds wrapped by torch.compile. When the EMA weights win, rfdetr saves them under the wrapper's
    names (`_orig_mod.class_embed.bias`), which its own loader does not strip in this format: `from_checkpoint`
    stops with KeyError 'class_embed.bias', and so would the evaluate and export stages. Those names lose the prefix
    here; every other checkpoint is copied byte for byte."""
    import torch

    checkpoint = torch.load(source, map_location="cpu", weights_only=False)  # rfdetr's own file, with its args
    weights = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    renamed = [name for name in weights or {} if name.startswith(COMPILED_MODULE_PREFIX)]
    if not renamed:
        shutil.copyfile(source, dest)
        return 0
    checkpoint["model"] = {name.removeprefix(COMPILED_MODULE_PREFIX): value for name, value in weights.items()}
    partial = dest.with_name(dest.name + ".partial")
    torch.save(checkpoint, partial)
    partial.replace(dest)
    log.info("Best weights: %d names of the compiled model written without %r", len(renamed), COMPILED_MODULE_PREFIX)
    return len(renamed)


def export_block(state_dir: Path, outdir: Path, start: int, end: int, run_info: dict[str, Any]) -> None:
    """Copy the block's checkpoint, best weights (`copy_best_weights`), metrics rows and epoch records into its
    output folder."""
    outdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(state_dir / "last.ckpt", outdir / "checkpoint.ckpt")
    copy_best_weights(state_dir / "checkpoint_best_total.pth", outdir / "best.pth")
    rows = copy_metric_rows(state_dir / "metrics.csv", outdir / "metrics.csv", lambda epoch: start <= epoch < end)
    write_json(outdir / "epochs.json", read_epoch_log(state_dir / "epochs.jsonl", start, end))
    write_json(outdir / "run.json", run_info)
    log.info("Block outputs written to %s (%d metrics rows)", outdir, rows)

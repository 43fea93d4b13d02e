"""Per-step loss differences between every pair of runs, across calls: is a lever's drift from the stock recipe
larger than two stock runs drift from each other?

usage: python -m bench.loss_pairs [--first-steps N] [--by-kind] SUMMARY.json [SUMMARY.json ...]

Each summary is a `bench.compare` summary.json (copied out of its call under any name); every run in it is named
<file stem>/<run>. All runs must have the same seed, data and batch, so that step i saw the same images in each.
Prints, for every pair, the mean and largest absolute difference of the per-step training loss and the mean of
the last 20 steps of both, and the pairs' kind: stock-stock pairs are the recipe's run-to-run noise. Where both
runs' epoch records carry `EpochLog`'s `rng_digests`, also the first epoch at whose start they differ
(`random_numbers_part_at_epoch`, None: the same random numbers throughout): from there the runs saw different random
draws (the loader's worker seeds among them), not only different arithmetic.

`--by-kind` prints, instead of every pair, the pairs grouped by the kinds of their two runs, a run's kind being its
name's leading lower-case letters (`stock2` and `stock` are stock, `coldD` is cold): for each group the number of
pairs and the least, largest and mean relative difference in per cent, each kind's last-20-step means, each
kind's mean and standard deviation of them, and each run's mean difference from the stock runs (for a stock run,
from the other stock runs); and each run's signed difference from the stock runs' mean, epoch by epoch, with each
kind's last-epoch spread of it (`epoch_drift`: do a kind's runs end above the recipe's?), tested against the stock
runs' for location and spread (`against_stock`: could the difference be the luck of the draw?). Tests:
tests/test_bench.py::test_every_pair_of_runs_across_calls_gets_its_loss_difference_and_its_kind,
tests/test_bench.py::test_a_pair_says_from_which_epoch_its_runs_drew_other_random_numbers,
tests/test_bench.py::test_pairs_grouped_by_kind_give_each_groups_spread_and_each_kinds_last_losses,
tests/test_bench.py::test_each_runs_signed_drift_from_the_stock_runs_is_given_epoch_by_epoch,
tests/test_bench.py::test_each_kinds_last_epoch_is_tested_against_the_stock_runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from bench.side_by_side import loss_difference, named_runs, step_losses
from rfdetr_coco_pipeline.common import read_json, run_stage


def first_epoch_with_other_random_numbers(first: dict[str, Any], second: dict[str, Any]) -> int | None:
    """The first epoch whose start found the two runs' random number generators in different states; None when
    they agree at every epoch both made."""
    for one, other in zip(first["records"], second["records"], strict=False):  # over the epochs both made
        if one["rng_digests"] != other["rng_digests"]:
            return one["epoch"]
    return None


def loss_pairs(runs: dict[str, dict[str, Any]], first_steps: int | None = None) -> list[dict[str, Any]]:
    """One row per pair of runs: their kind (stock-stock, stock-other, other-other) and loss differences, over
    the first `first_steps` steps (None: every step both made)."""
    rows = []
    for first, second in itertools.combinations(runs, 2):
        stock = sum(run_kind(name) == "stock" for name in (first, second))
        kind = {2: "stock-stock", 1: "stock-other", 0: "other-other"}[stock]
        row = {
            "pair": [first, second],
            "kind": kind,
            **loss_difference(step_losses(runs[first])[:first_steps], step_losses(runs[second])[:first_steps]),
        }
        if all("rng_digests" in r for run in (runs[first], runs[second]) for r in run["records"]):
            row["random_numbers_part_at_epoch"] = first_epoch_with_other_random_numbers(runs[first], runs[second])
        rows.append(row)
    return sorted(rows, key=lambda row: (row["kind"], row.get("mean_abs_difference", 0)))


def run_kind(name: str) -> str:
    """A run's kind: the leading lower-case letters of its run name (`call4-summary-stock2/stock2` is stock)."""
    run = name.rsplit("/", 1)[-1]
    return re.match(r"[a-z]*", run).group() or run


def by_kind(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`loss_pairs`' rows grouped by the kinds of their two runs: each group's count and the least, largest and mean
    relative difference (per cent), each kind's runs' last-20-step means, and per kind the mean and standard
    deviation of those means (does one kind end higher than another by more than its runs spread?), and each run's
    mean difference from the stock runs (a stock run's from the other stock runs: how far the recipe's own runs lie
    from each other)."""
    groups: dict[str, list[float]] = {}
    last_losses: dict[str, dict[str, float]] = {}
    to_stock: dict[str, list[float]] = {}  # each run's differences from the stock runs (but itself)
    for row in rows:
        if "mean_abs_difference_relative" not in row:  # a pair without a step in common
            continue
        kinds = sorted(run_kind(name) for name in row["pair"])
        groups.setdefault(" / ".join(kinds), []).append(100 * row["mean_abs_difference_relative"])
        for name, other in (row["pair"], row["pair"][::-1]):
            if run_kind(other) == "stock":
                to_stock.setdefault(name, []).append(100 * row["mean_abs_difference_relative"])
        for name, last in zip(row["pair"], row.get("last_20_steps_mean") or (), strict=False):
            last_losses.setdefault(run_kind(name), {})[name] = last
    return {
        "pairs": {
            group: {
                "pairs": len(values),
                "least_percent": round(min(values), 2),
                "largest_percent": round(max(values), 2),
                "mean_percent": round(sum(values) / len(values), 2),
            }
            for group, values in sorted(groups.items())
        },
        "last_20_steps_mean": {kind: dict(sorted(runs.items())) for kind, runs in sorted(last_losses.items())},
        "last_20_steps_mean_by_kind": {
            kind: {
                "runs": len(runs),
                "mean": round(statistics.fmean(runs.values()), 4),
                "sd": round(statistics.stdev(runs.values()), 4) if len(runs) > 1 else None,
            }
            for kind, runs in sorted(last_losses.items())
        },
        "mean_percent_to_the_stock_runs": dict(  # nearest first
            sorted(
                ((name, round(statistics.fmean(values), 3)) for name, values in to_stock.items()), key=lambda kv: kv[1]
            )
        ),
    }


def epoch_drift(runs: dict[str, dict[str, Any]], first_steps: int | None = None) -> dict[str, Any]:
    """Each run's signed mean relative difference (per cent) of its per-step losses from the mean of the stock runs'
    (a stock run's: from the other stock runs' mean), epoch by epoch over the first `first_steps` steps, and per kind
    the last epoch's figures: positive where a run's losses lie above the recipe's runs', and from which epoch. Runs
    whose spread (`by_kind`) is wider than the stock runs' may lie above and below them alike, or mostly above."""
    stock = [name for name in runs if run_kind(name) == "stock"]
    drift: dict[str, list[float]] = {}
    for name, run in runs.items():
        others = [step_losses(runs[other])[:first_steps] for other in stock if other != name]
        if not others:
            continue
        losses = step_losses(run)[:first_steps]
        steps = min(len(losses), *(len(other) for other in others))
        reference = [statistics.fmean(other[step] for other in others) for step in range(steps)]
        per_epoch, start = [], 0
        for record in run["records"]:
            end = min(start + len(record.get("loss", [])), steps)
            if end > start:
                relative = ((losses[step] - reference[step]) / reference[step] for step in range(start, end))
                per_epoch.append(round(100 * statistics.fmean(relative), 3))
            start += len(record.get("loss", []))
        drift[name] = per_epoch
    last: dict[str, list[float]] = {}
    for name, per_epoch in drift.items():
        if per_epoch:
            last.setdefault(run_kind(name), []).append(per_epoch[-1])
    return {
        "last_epoch_against_stock": against_stock(last),
        "epoch_drift_from_stock_percent": drift,
        "last_epoch_drift_by_kind": {
            kind: {
                "runs": len(values),
                "least": min(values),
                "largest": max(values),
                "mean": round(statistics.fmean(values), 3),
                "sd": round(statistics.stdev(values), 3) if len(values) > 1 else None,
            }
            for kind, values in sorted(last.items())
        },
    }


def against_stock(last: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """For each kind but stock, and for all of them pooled ("every other kind"), two-sided tests of its runs'
    last-epoch drift against the stock runs': Mann-Whitney U (`location_p`: do its runs end higher or lower?) and
    Brown-Forsythe (`spread_p`: do they spread wider or narrower?). A small p says the difference is unlikely to be
    the luck of which runs were drawn; a kind of one run, or fewer than two stock runs, gets no test. Test:
    tests/test_bench.py::test_each_kinds_last_epoch_is_tested_against_the_stock_runs."""
    import numpy
    from scipy import stats

    stock = last.get("stock", [])
    kinds = {kind: values for kind, values in sorted(last.items()) if kind != "stock"}
    if len(kinds) > 1:
        kinds["every other kind"] = [value for values in kinds.values() for value in values]
    tests = {}
    for kind, values in kinds.items():
        if len(values) < 2 or len(stock) < 2:
            continue
        with numpy.errstate(divide="ignore", invalid="ignore"):  # no spread within either group: no p (None)
            location = stats.mannwhitneyu(values, stock, alternative="two-sided").pvalue
            spread = stats.levene(values, stock, center="median").pvalue
        tests[kind] = {
            "runs": len(values),
            "stock_runs": len(stock),
            "location_p": round(float(location), 3) if math.isfinite(location) else None,
            "spread_p": round(float(spread), 3) if math.isfinite(spread) else None,
        }
    return tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-steps", type=int, help="only the first N steps of each run")
    parser.add_argument("--by-kind", action="store_true", help="the pairs grouped by their runs' kinds (above)")
    parser.add_argument("summaries", nargs="+", type=Path)
    args = parser.parse_args()
    runs = named_runs({path.stem: read_json(path) for path in args.summaries})
    rows = loss_pairs(runs, args.first_steps)
    print(json.dumps({**by_kind(rows), **epoch_drift(runs, args.first_steps)} if args.by_kind else rows, indent=1))


if __name__ == "__main__":
    run_stage(main)

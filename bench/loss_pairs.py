"""Per-step loss differences between every pair of runs, across calls: is a lever's drift from the stock recipe
larger than two stock runs drift from each other?

usage: python -m bench.loss_pairs [--first-steps N] SUMMARY.json [SUMMARY.json ...]

Each summary is a `bench.compare` summary.json (copied out of its call under any name); every run in it is named
<file stem>/<run>. All runs must have the same seed, data and batch, so that step i saw the same images in each.
Prints, for every pair, the mean and largest absolute difference of the per-step training loss and the mean of
the last 20 steps of both, and the pairs' kind: stock-stock pairs are the recipe's run-to-run noise. Where both
runs' epoch records carry `EpochLog`'s `rng_digests`, also the first epoch at whose start they differ
(`random_numbers_part_at_epoch`, None: the same random numbers throughout): from there the runs saw different random
draws (the loader's worker seeds among them), not only different arithmetic. Tests:
tests/test_bench.py::test_every_pair_of_runs_across_calls_gets_its_loss_difference_and_its_kind,
tests/test_bench.py::test_a_pair_says_from_which_epoch_its_runs_drew_other_random_numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from bench.side_by_side import loss_difference, named_runs, step_losses
from pipeline.common import read_json, run_main


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
        stock = sum(name.endswith("/stock") for name in (first, second))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-steps", type=int, help="only the first N steps of each run")
    parser.add_argument("summaries", nargs="+", type=Path)
    args = parser.parse_args()
    rows = loss_pairs(named_runs({path.stem: read_json(path) for path in args.summaries}), args.first_steps)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    run_main(main)

"""How many notebook runs tell its spread from the train stage's? Draws normal last-epoch drifts with the spread the
notebook's runs show and with the mean and spread the train stage's runs show (a `bench.loss_pairs --by-kind` output:
this folder's loss-pairs-by-kind.json, six notebook runs and 25 of the stage, unless another is named), and counts
how often Brown-Forsythe and Mann-Whitney (as bench.loss_pairs' `against_stock`) find p < 0.05.

usage: PYTHONPATH=. python bench/results/2026-12-04-drift-cause/power.py [LOSS_PAIRS_BY_KIND.json]
"""

import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from bench.loss_pairs import run_kind

source = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "loss-pairs-by-kind.json"
drift = json.loads(source.read_text())["epoch_drift_from_stock_percent"]
stage = [epochs[-1] for name, epochs in drift.items() if run_kind(name) != "stock"]
stock = [epochs[-1] for name, epochs in drift.items() if run_kind(name) == "stock"]
mean, sd, stock_sd = statistics.fmean(stage), statistics.stdev(stage), statistics.stdev(stock)
print(f"stage runs {len(stage)}: mean {mean:.3f} sd {sd:.3f}; notebook runs {len(stock)}: sd {stock_sd:.3f}")
generator = np.random.default_rng(0)
for notebook_runs in (6, 9, 12, 15, 18):
    spread = location = 0
    for _ in range(2000):
        a, b = generator.normal(0, stock_sd, notebook_runs), generator.normal(mean, sd, len(stage))
        spread += stats.levene(a, b, center="median").pvalue < 0.05
        location += stats.mannwhitneyu(a, b).pvalue < 0.05
    print(f"{notebook_runs} notebook runs: Brown-Forsythe {spread / 2000:.2f}, Mann-Whitney {location / 2000:.2f}")

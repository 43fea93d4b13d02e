"""Did every run see the same batches? Per epoch, the correlation between two runs' step-to-step loss wiggles (each
step's loss less its 9-step moving average), for every pair within and across the run kinds. Runs fed different
augmentations would wiggle independently (correlation near 0); the same batches give correlations near 1. Also each
kind's mean loss over each epoch.

usage: PYTHONPATH=. python bench/results/2026-12-04-notebook-noise/same_batches.py (from the repository root)
"""

import itertools
import json
from pathlib import Path

import numpy as np

from bench.side_by_side import step_losses

N, D, Z = (
    Path("bench/results") / f for f in ("2026-12-04-notebook", "2026-12-04-cold-warm", "2026-12-04-notebook-noise")
)
FILES = {
    "stock": [N / "call1-summary-stock.json", N / "call4-summary-stock2.json"]
    + [Z / f"summary-stock{x}.json" for x in "GHIJ"],
    "cold": [N / "call2-summary-cold.json", N / "call5-summary-cold.json"]
    + [D / f"summary-cold{x}.json" for x in "DEF"],
    "warm": [N / "call2-summary-warm.json", N / "call5-summary-warm.json"]
    + [D / f"summary-warm{x}.json" for x in "DEF"],
}
STEPS = 93  # a step per 128 of the set's 11,829 images, rounded up, as the runs log


def losses(path: Path) -> np.ndarray:
    (run,) = [v for v in json.loads(path.read_text()).values() if isinstance(v, dict) and "records" in v]
    return np.array(step_losses(run)[: 3 * STEPS])


def wiggles(loss: np.ndarray, width: int = 9) -> np.ndarray:
    padded = np.pad(loss, (width // 2, width // 2), mode="edge")
    return loss - np.convolve(padded, np.ones(width) / width, mode="valid")


def correlations(pairs, part: slice) -> str:
    values = [np.corrcoef(wiggles(a[part]), wiggles(b[part]))[0, 1] for a, b in pairs]
    return f"{min(values):.3f}-{max(values):.3f}"


runs = {kind: [losses(p) for p in paths] for kind, paths in FILES.items()}
stage = runs["cold"] + runs["warm"]
for epoch in range(3):
    part = slice(epoch * STEPS, (epoch + 1) * STEPS)
    notebook_pairs = correlations(itertools.combinations(runs["stock"], 2), part)
    print(
        f"epoch {epoch}: loss wiggles' correlation, notebook-notebook {notebook_pairs},"
        f" train stage-notebook {correlations(itertools.product(stage, runs['stock']), part)},"
        f" train stage-train stage {correlations(itertools.combinations(stage, 2), part)};"
        f" mean loss {', '.join(f'{k} {np.mean([r[part].mean() for r in v]):.4f}' for k, v in runs.items())}"
    )

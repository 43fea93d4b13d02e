"""Each H200 run's epochs after the first, as NOTES.md ("On the H200") gives them: the wait before the epoch, its
training seconds, its first batch's wait, and its steps in three spans (EpochLog's `step_seconds`: the first ten,
the next twenty, the rest), from the summaries that came back.
Run with `python bench/results/2026-12-05-checkpoints/epoch_starts.py` (output: epoch-starts.txt)."""

import json
from pathlib import Path

HERE = Path(__file__).parent
for name in ("with", "with2", "without2"):
    run = json.loads((HERE / f"gpu-summary-{name}.json").read_text())[name]
    for record in run["records"][1:]:
        steps = record["step_seconds"]
        print(
            f"{name:9} epoch {record['epoch']}: wait {record['since_previous_epoch_seconds']}, training "
            f"{record['train_seconds']}, first batch {record['first_batch_seconds']}, steps 1-10 "
            f"{sum(steps[:10]):.2f}, 11-30 {sum(steps[10:30]):.2f}, 31- {sum(steps[30:]):.2f}"
        )

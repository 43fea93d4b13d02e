"""Parse time of train annotations as the source holds them and as the staged copy holds them, alternating.

usage: python bench/results/2026-12-03-stage-check/annotations_side_by_side.py FULL.json [ROUNDS]
Writes FULL.json's staged form beside it (`scripts.stage.copy_without_segmentation`, timed), then times pycocotools'
COCO() on each, as rfdetr's training dataset loads it, ROUNDS times each. Prints JSON.
"""

import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

from pycocotools.coco import COCO

from scripts.stage import copy_without_segmentation

full = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
staged = full.with_name(full.stem + "-staged.json")
started = time.perf_counter()
copy_without_segmentation(full, staged)
strip_seconds = round(time.perf_counter() - started, 2)
seconds = {"source": [], "staged": []}
for _ in range(rounds):
    for name, path in (("source", full), ("staged", staged)):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            api = COCO(str(path))
        seconds[name].append(round(time.perf_counter() - started, 2))
        del api
medians = {name: statistics.median(values) for name, values in seconds.items()}
print(
    json.dumps(
        {
            "bytes": {"source": full.stat().st_size, "staged": staged.stat().st_size},
            "strip_seconds": strip_seconds,
            "seconds": seconds,
            "median_seconds": medians,
            "ratio": round(medians["source"] / medians["staged"], 2),
        },
        indent=1,
    )
)

"""A bench.compare summary for a notebook run whose process was stopped after its last epoch, before bench.compare
wrote one: call 1's stockG finished its three epochs (its epochs.jsonl has all three) but not its exit within the
call's limit.

usage: python bench/results/2026-12-04-notebook-noise/summary_from_epochs.py EPOCHS.jsonl SUMMARY.json
"""

import json
import sys
from pathlib import Path

from bench.compare import summarize

records = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
Path(sys.argv[2]).write_text(
    json.dumps({"stock": {"wall_seconds": None, **summarize(records), "records": records}}, indent=2)
)

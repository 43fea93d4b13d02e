"""A bench.compare summary for a notebook run whose process was stopped after its last epoch, before bench.compare
wrote one: call 1's stockG finished its three epochs (its epochs.jsonl has all three) but not its exit within the
call's limit.

usage: python bench/results/2026-12-04-notebook-noise/summary_from_epochs.py EPOCHS.jsonl SUMMARY.json
"""

import json
import sys
from pathlib import Path

from bench.compare import stock_summary

Path(sys.argv[2]).write_text(json.dumps({"stock": stock_summary(Path(sys.argv[1]), None)}, indent=2))

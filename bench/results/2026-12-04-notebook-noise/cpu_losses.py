"""Do the speedups' CPU paths change what the notebook's recipe computes? One epoch of its train() on the CPU
(bench.stock_recipe, 64 px, batch 4, no loader workers, one thread) with the speedups named, printing each step's
loss; run it with `none` and with every speedup that runs on the CPU, and compare the two lists.

usage: PYTHONPATH=. python bench/results/2026-12-04-notebook-noise/cpu_losses.py DATASET none|NAME,NAME,... OUT_DIR
       (every speedup that runs on the CPU, as a list:
       python -c "import rfdetr_extensions as r; print(','.join(s.name for s in r.SPEEDUPS if not s.gpu_only))")
"""

import json
import sys
from pathlib import Path

import torch
from rfdetr_extensions.callbacks.block_end import StopAtBlockEnd
from rfdetr_extensions.callbacks.epoch_log import EpochLog

import rfdetr_extensions
from bench.stock_recipe import train_like_notebook

torch.set_num_threads(1)
dataset, setting, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
names = [] if setting == "none" else setting.split(",")
selection = rfdetr_extensions.select_speedups(names or "none", rfdetr_extensions.CHECKED_RFDETR, device_kind="cpu")
out.mkdir(parents=True, exist_ok=True)
with rfdetr_extensions.applied(selection) as callbacks:
    logged = [StopAtBlockEnd(1), EpochLog(out / "epochs.jsonl"), *callbacks]
    train_like_notebook(dataset, out, 1, 4, logged, resolution=64, workers=0)
records = [json.loads(line) for line in (out / "epochs.jsonl").read_text().splitlines()]
print(json.dumps({"speedups": selection.names(), "loss": records[0]["loss"]}))

#!/usr/bin/env bash
# call 3: where a validation with validation_cuda_graphs and metrics_one_batch_behind waits (trace of the second
# validation), then before/on again, alternating, timed whole
set -u
T0=$(date +%s); t() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; t installed
export PYTHONPATH=/tmp/site:$PWD
python3 bench/synth_coco.py /dev/shm/val5k 1024 5000 --detail coco > /tmp/synth.log 2>&1; t "synth rc=$?"
timeout -k 10 200 python3 -m bench.validation --dataset /dev/shm/val5k --out /tmp/vo-trace.json --epochs 2 --whole --eager \
  --speedups all --trace /tmp/val.trace.json.gz > /tmp/trace-run.log 2>&1; t "trace run rc=$?"
python3 -m bench.trace_ops /tmp/val.trace.json.gz --steps 1 --top 40 --idle-ms 1 > "$OUT/trace-validation.json" 2>&1; t "trace read rc=$?"
E="--whole --eager"
OUT=/tmp/vo DATA=/dev/shm/val5k EPOCHS=3 LOADER_WORKERS=0 LIMIT=120 \
  RUNS="before|$E --speedups all,-validation_cuda_graphs,-metrics_one_batch_behind;on|$E --speedups all" \
  bash bench/gpu_run.sh validation
t "validation runs done"
python3 - >> "$OUT/times.txt" 2>&1 <<'PY'
import json, glob, os
runs = {os.path.basename(f)[len("validation-"):-len(".json")]: json.load(open(f)) for f in sorted(glob.glob("/tmp/vo/validation-*.json"))}
runs["trace"] = json.load(open("/tmp/vo-trace.json"))
json.dump(runs, open(os.environ["OUT"] + "/validations.json", "w"), indent=1)
for name, run in runs.items():
    print(name, [round(v["seconds"], 3) for v in run["validations"]])
PY
{ tr '\r' '\n' < /tmp/trace-run.log | grep -v "it/s" | tail -c 8000; for f in /tmp/vo/validation-*.log; do echo "== $f"; tail -c 4000 "$f"; done; } > "$OUT/logs.txt"
tr '\r' '\n' < /tmp/trace-run.log | grep -h "Validation CUDA graphs" | sort | uniq -c >> "$OUT/times.txt"
t end

#!/usr/bin/env bash
# validation of 5,000 images, 3 epochs: with the phase clocks without validation_batches_on_device, then timed whole with it
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); t() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"; }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; t installed
export PYTHONPATH=/tmp/site:$PWD
[ -f /dev/shm/val5k/annotations/instances_val2017.json ] || python3 bench/synth_coco.py /dev/shm/val5k 1024 5000 --detail coco > /tmp/synth.log 2>&1; t synth
OUT=/tmp/vo4 DATA=/dev/shm/val5k EPOCHS=3 LOADER_WORKERS=0 LIMIT=110 \
  RUNS="before_phases|--eager --speedups all,-validation_batches_on_device;kept2|--whole --eager --speedups all" \
  bash bench/gpu_run.sh validation
t "validation runs done"
python3 - >> "$OUT/times.txt" 2>&1 <<'PY'
import json, glob, os
runs = {os.path.basename(f)[len("validation-"):-len(".json")]: json.load(open(f)) for f in sorted(glob.glob("/tmp/vo4/validation-*.json"))}
json.dump(runs, open(os.environ["OUT"] + "/validations.json", "w"), indent=1)
for name, run in runs.items():
    print(name, [{k: round(v[k], 3) for k in ("seconds", "loader", "forward", "batch_callbacks", "epoch_end")} for v in run["validations"]])
PY
grep -h "Validation batches" /tmp/vo4/validation-*.log >> "$OUT/times.txt"
cat "$OUT/times.txt"

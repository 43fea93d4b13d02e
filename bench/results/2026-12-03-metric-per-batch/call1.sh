#!/usr/bin/env bash
# The GPU tests of metric_update_per_batch and the validation metrics; then validation of 5,000 images at COCO's
# sizes, one run after the other, 3 epochs each: validation speedups off / every speedup but the new one / every
# speedup / the two again / every speedup with the phase clocks.
set -u
cd "$(dirname "$0")/../../.."
T0=$(date +%s); t() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; t installed
export PYTHONPATH=/tmp/site:$PWD
(python3 bench/synth_coco.py /dev/shm/val5k 1024 5000 --detail coco > /tmp/synth.log 2>&1; echo "synth rc=$?" >> /tmp/synth.log) & synth=$!
CUDA_VISIBLE_DEVICES=0 timeout -k 10 200 python3 -m pytest -m gpu tests/test_metric_update_per_batch.py tests/test_validation_metrics.py -o addopts="" -p no:cacheprovider -rA -q > /tmp/gpu-test.txt 2>&1
rc=$?; t "gpu tests rc=$rc"
grep -v DEBUG /tmp/gpu-test.txt | tail -40 > "$OUT/gpu-tests.txt"
wait $synth; tail -2 /tmp/synth.log >> "$OUT/times.txt"; t synth
V=all,-validation_images_as_bytes,-metric_update_per_batch,-metric_inputs_in_one_copy,-matching_in_workers,-evaluation_on_every_core,-validation_loader_ahead
E="--whole --eager"
OUT=/tmp/vo DATA=/dev/shm/val5k EPOCHS=3 LOADER_WORKERS=0 LIMIT=120 \
  RUNS="off|$E --speedups $V;before|$E --speedups all,-metric_update_per_batch;on|$E --speedups all;before2|$E --speedups all,-metric_update_per_batch;on2|$E --speedups all;phases|--eager --speedups all" \
  bash bench/gpu_run.sh validation
t "validation runs done"
cat /tmp/vo/env-validation.txt >> "$OUT/times.txt"
python3 - >> "$OUT/times.txt" 2>&1 <<'PY'
import json, glob, os
runs = {os.path.basename(f)[len("validation-"):-len(".json")]: json.load(open(f)) for f in sorted(glob.glob("/tmp/vo/validation-*.json"))}
json.dump(runs, open(os.environ["OUT"] + "/validations.json", "w"), indent=1)
for name, run in runs.items():
    print(name, [round(v["seconds"], 3) for v in run["validations"]])
    if "loader" in run["validations"][0]:
        print(name, "phases", [{k: round(v[k], 3) for k in ("loader", "forward", "batch_callbacks", "epoch_end")} for v in run["validations"]])
PY
for f in /tmp/vo/validation-*.log; do echo "== $f"; tail -c 6000 "$f"; done > "$OUT/validation-logs.txt"
grep -h "Validation batches" /tmp/vo/validation-*.log >> "$OUT/times.txt"
t end
cat "$OUT/times.txt"

#!/usr/bin/env bash
# call 2: the GPU tests of the validation speedups; if they pass, validation of 5,000 images, one run after the other:
# validation speedups off / before today / + validation_cuda_graphs / + metrics_one_batch_behind (all) / all with phase clocks
set -u
T0=$(date +%s); t() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; t installed
export PYTHONPATH=/tmp/site:$PWD
(python3 bench/synth_coco.py /dev/shm/val5k 1024 5000 --detail coco > /tmp/synth.log 2>&1; echo "synth rc=$?" >> /tmp/synth.log) & synth=$!
CUDA_VISIBLE_DEVICES=0 timeout -k 10 200 python3 -m pytest -m gpu tests/test_validation_cuda_graphs.py tests/test_metrics_one_batch_behind.py tests/test_validation_metrics.py -o addopts="" -p no:cacheprovider -rA -q > "$OUT/gpu-test.txt" 2>&1
rc=$?; t "gpu tests rc=$rc"
grep -q "test_on_the_gpu_replays_equal_the_uncompiled_forward_and_follow_the_weights" <(grep PASSED "$OUT/gpu-test.txt") || { kill $synth; t "graph test did not pass: stop"; exit 1; }
wait $synth; tail -2 /tmp/synth.log >> "$OUT/times.txt"; t synth
V=all,-validation_images_as_bytes,-metric_inputs_in_one_copy,-matching_in_workers,-evaluation_on_every_core,-validation_loader_ahead,-validation_cuda_graphs,-metrics_one_batch_behind
E="--whole --eager"
OUT=/tmp/vo DATA=/dev/shm/val5k EPOCHS=3 LOADER_WORKERS=0 LIMIT=150 \
  RUNS="off|$E --speedups $V;before|$E --speedups all,-validation_cuda_graphs,-metrics_one_batch_behind;graphs|$E --speedups all,-metrics_one_batch_behind;on|$E --speedups all;phases|--eager --speedups all" \
  bash bench/gpu_run.sh validation
t "validation runs done"
cat /tmp/vo/env-validation.txt >> "$OUT/times.txt"
python3 - >> "$OUT/times.txt" 2>&1 <<'PY'
import json, glob, os
runs = {os.path.basename(f)[len("validation-"):-len(".json")]: json.load(open(f)) for f in sorted(glob.glob("/tmp/vo/validation-*.json"))}
json.dump(runs, open(os.environ["OUT"] + "/validations.json", "w"), indent=1)
for name, run in runs.items():
    print(name, [round(v["seconds"], 3) for v in run["validations"]])
PY
for f in /tmp/vo/validation-*.log; do echo "== $f"; tail -c 15000 "$f"; done > "$OUT/validation-logs.txt"
grep -h "Validation CUDA graphs" /tmp/vo/validation-*.log | sort | uniq -c >> "$OUT/times.txt"
t end

#!/usr/bin/env bash
# call 1: the new speedup's GPU test, then validation of 5,000 images: validation speedups off / all but the new one / all
set -u
T0=$(date +%s); t() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; t installed
export PYTHONPATH=/tmp/site:$PWD
(python3 bench/synth_coco.py /dev/shm/val5k 1024 5000 --detail coco > /tmp/synth.log 2>&1; echo "synth rc=$?" >> /tmp/synth.log) & synth=$!
CUDA_VISIBLE_DEVICES=0 timeout -k 10 150 python3 -m pytest -m gpu tests/test_validation_cuda_graphs.py -o addopts="" -p no:cacheprovider -rA -q > "$OUT/gpu-test.txt" 2>&1
t "gpu test rc=$?"
wait $synth; cat /tmp/synth.log | tail -2 >> "$OUT/times.txt"; t synth
V=all,-validation_images_as_bytes,-metric_inputs_in_one_copy,-matching_in_workers,-evaluation_on_every_core,-validation_loader_ahead,-validation_cuda_graphs
E="--whole --eager"
OUT=$OUT DATA=/dev/shm/val5k EPOCHS=3 LOADER_WORKERS=0 LIMIT=150 \
  RUNS="off|$E --speedups $V;before|$E --speedups all,-validation_cuda_graphs;on|$E --speedups all;on-phases|--eager --speedups all" \
  bash bench/gpu_run.sh validation
t "validation runs done"
for f in "$OUT"/validation-*.json; do python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], [ (round(r['seconds'],3)) for r in d.get('validations', [])] if 'validations' in d else list(d)[:12])" "$f" >> "$OUT/times.txt" 2>&1; done
grep -h "Validation CUDA graphs" "$OUT"/validation-*.log | sort | uniq -c >> "$OUT/times.txt"
t end

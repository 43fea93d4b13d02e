#!/usr/bin/env bash
# GPU tests at HEAD, while the 5,000-image validation set at COCO's sizes is written; then the validation loader pass.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; git log -1 --format=%H 2>/dev/null; } > $OUT/env.txt 2>&1
( nice -n 10 python3 bench/synth_coco.py /dev/shm/val5k 1024 5000 --detail coco > /tmp/synth.log 2>&1; echo "synth rc $?" >> /tmp/synth.log ) &
synth=$!
s=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout -k 20 470 python3 -m pytest -m gpu tests -o addopts="" -p no:cacheprovider -rA --durations=10 > /tmp/gpu-tests.txt 2>&1
echo "rc $? in $(( $(date +%s) - s )) s" >> /tmp/gpu-tests.txt
grep -v "DEBUG\|^$" /tmp/gpu-tests.txt | tail -60 > $OUT/gpu-tests.txt
wait $synth; cat /tmp/synth.log | tail -3 >> $OUT/env.txt
for i in 1 2; do
  python3 -m bench.loader --dataset /dev/shm/val5k --split val --workers 16 --images-as-bytes > $OUT/loader-val-$i.json 2>> /tmp/loader.log
done
tail -20 /tmp/loader.log > $OUT/loader.log
cat $OUT/loader-val-*.json

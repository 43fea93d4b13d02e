#!/usr/bin/env bash
# Every GPU test at this commit, while the set of COCO's size for calls 2-3 is written to the RAM disk (niced).
set -u
cd "$(dirname "$0")/../../.."
T0=$(date +%s); t() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; t installed
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "rfdetr", m.version("rfdetr"), "snakemake", m.version("snakemake"))'
} >> "$OUT/times.txt" 2>&1
(nice -n 19 python3 bench/synth_coco.py /dev/shm/coco-full 118287 5000 --detail coco --distinct-train 11829 \
  > /tmp/synth.log 2>&1; echo "synth rc=$?" >> /tmp/synth.log) & synth=$!
CUDA_VISIBLE_DEVICES=0 timeout -k 10 540 python3 -m pytest -m gpu tests -o addopts="" -p no:cacheprovider -rA \
  --durations=12 > /tmp/gpu-tests.txt 2>&1
rc=$?; t "gpu tests rc=$rc"
grep -v DEBUG /tmp/gpu-tests.txt | tail -80 > "$OUT/gpu-tests.txt"
wait $synth; tail -3 /tmp/synth.log >> "$OUT/times.txt"; t synth
du -sh /dev/shm/coco-full >> "$OUT/times.txt" 2>&1
cat "$OUT/times.txt"

#!/usr/bin/env bash
# Every GPU test at the session's code.
set -u
cd "$(dirname "$0")/.."
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
git log -1 --format=%H > "$OUT/env.txt" 2>&1 || true
s=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout -k 20 540 python3 -m pytest -m gpu tests -o addopts="" -p no:cacheprovider -rA --durations=10 > /tmp/gpu-tests.txt 2>&1
echo "rc $? in $(( $(date +%s) - s )) s" >> /tmp/gpu-tests.txt
grep -v "DEBUG\|^$" /tmp/gpu-tests.txt | tail -80 > "$OUT/gpu-tests.txt"
tail -30 "$OUT/gpu-tests.txt"

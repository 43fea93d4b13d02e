#!/usr/bin/env bash
# throwaway: metrics_one_batch_behind GPU test; validation of 5,000 images timed whole: before today's two, with
# evaluation_on_every_core, with both
set -u
export PYTHONUNBUFFERED=1
R=$OUT; W=/tmp/c3; mkdir -p $W
finish() { tar czf $R/call3.tgz -C /tmp c3; }
trap finish EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
git log --oneline -1 > $W/commit.txt 2>&1 || true
s=$(date +%s)
timeout 120 python3 -m pytest -m gpu -o addopts="" -p no:cacheprovider tests/test_metrics_one_batch_behind.py > $W/gpu-test.txt 2>&1
echo "gpu test rc=$? $(( $(date +%s)-s )) s" | tee -a $W/times.txt; tail -1 $W/gpu-test.txt
s=$(date +%s)
OUT=$W DATA=/dev/shm/val5k N_TRAIN=1024 N_VAL=5000 DETAIL=coco EPOCHS=3 LOADER_WORKERS=0 LIMIT=150 \
  RUNS="before|--whole --eager --speedups all,-evaluation_on_every_core,-metrics_one_batch_behind;cores|--whole --eager --speedups all,-metrics_one_batch_behind;both|--whole --eager --speedups all;phases|--eager --speedups all" \
  bash bench/gpu_run.sh validation
echo "validation $(( $(date +%s)-s )) s" | tee -a $W/times.txt
for n in before cores both phases; do echo $n; grep '^{' $W/validation-$n.log | cut -c1-400; grep -i "error\|failed" $W/validation-$n.log | head -3; done

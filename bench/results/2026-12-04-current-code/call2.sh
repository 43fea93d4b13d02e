#!/usr/bin/env bash
# The train stage's first block as a run from scratch has it: the compile_warmup rule on an empty compile cache,
# then one epoch on the set of COCO's size that call 1 wrote (written here if the RAM disk lost it).
set -u
cd "$(dirname "$0")/../../.."
S="DATA=/dev/shm/coco-full N_TRAIN=118287 N_VAL=5000 DISTINCT_TRAIN=11829 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1"
env $S SHARE_CACHE=1 NAME=warmup EPOCHS=1 COMPILE_WARMUP=1 LIMIT=560 bash bench/gpu_run.sh route
r=/tmp/r-warmup/warmup
tar czf "$OUT/warmup-extra.tgz" -C "$r" results/benchmarks results/logs/train 2>/dev/null
tail -5 "$OUT/compare-warmup.txt"

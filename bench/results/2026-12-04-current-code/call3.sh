#!/usr/bin/env bash
# The train stage, one block of two epochs on the compile cache call 2 left (a run's later blocks).
set -u
cd "$(dirname "$0")/../../.."
S="DATA=/dev/shm/coco-full N_TRAIN=118287 N_VAL=5000 DISTINCT_TRAIN=11829 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1"
env $S SHARE_CACHE=1 NAME=warm EPOCHS=2 LIMIT=570 bash bench/gpu_run.sh route
r=/tmp/r-warm/warm
tar czf "$OUT/warm-extra.tgz" -C "$r" results/benchmarks results/logs/train 2>/dev/null
tail -5 "$OUT/compare-warm.txt"

#!/usr/bin/env bash
# The train stage through snakemake on call 1's set: one block of three epochs on an empty compile cache without the
# compile warm-up (cold), then again on the cache it left (warm, a run's later blocks).
set -u
cd "$(dirname "$0")/../../.."
S="DATA=/dev/shm/coco-prop N_TRAIN=11829 N_VAL=500 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1 SHARE_CACHE=1 EPOCHS=3"
start=$(date +%s)
rm -rf /tmp/compile-cache
env $S NAME=cold LIMIT=330 bash bench/gpu_run.sh route
echo "cold: $(( $(date +%s) - start )) s" | tee "$OUT/times.txt"
env $S NAME=warm LIMIT=$(( 575 - ($(date +%s) - start) )) bash bench/gpu_run.sh route
echo "warm: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
for name in cold warm; do
  tar czf "$OUT/$name-extra.tgz" -C "/tmp/r-$name/$name" results/benchmarks results/logs/train 2>/dev/null
  tail -4 "$OUT/compare-$name.txt"
done

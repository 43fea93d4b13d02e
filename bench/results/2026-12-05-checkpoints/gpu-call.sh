#!/usr/bin/env bash
# checkpoints_in_background on the H200: the train stage without and with it, one block of four epochs each, one
# after the other on one compile cache, on the set of COCO's train/validation proportion at COCO's image sizes.
# Two device calls back to back (the second finds the first's /dev/shm set and /tmp compile cache):
#   OUT=$OUT PART=1 bash bench/results/2026-12-05-checkpoints/gpu-call.sh   # the set, and a run that fills the cache
#   OUT=$OUT PART=2 bash bench/results/2026-12-05-checkpoints/gpu-call.sh   # without, then with
#   OUT=$OUT PART=2 ORDER="with without" SUFFIX=2 bash ...gpu-call.sh       # a second pair, in the other order
#   SET=val5000 before each: the same on a set with COCO's 5,000 validation images
# Compare since_previous_epoch_seconds, train_seconds and the train job's seconds (summary-<name>.json), and project
# each with bench.projection.
set -u
cd "$(dirname "$0")/../../.."
# SET=val5000 (both parts): 5,000 validation images, COCO's, so that validation lasts as long as in a COCO run and the
# loader's first batches of the next epoch are ready before it ends (NOTES.md, "On the H200")
if [ "${SET:-prop}" = val5000 ]; then set_=("DATA=/dev/shm/coco-val5000" N_VAL=5000); else set_=("DATA=/dev/shm/coco-prop" N_VAL=500); fi
S="${set_[*]} N_TRAIN=11829 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1 SHARE_CACHE=1"
if [ "${PART:?PART is 1 or 2}" = 1 ]; then
  env $S NAME=fill EPOCHS=1 LIMIT=450 bash bench/gpu_run.sh route
else
  export PYTHONPATH=/tmp/site:$PWD
  without=$(python3 -c 'import json, rfdetr_extensions as r
print(json.dumps({"speedups": [n for n in r.NAMES if n != "checkpoints_in_background"]}))')
  order=${ORDER:-without with} suffix=${SUFFIX:-}
  for kind in $order; do
    if [ "$kind" = without ]; then train=$without; else train='{}'; fi
    env $S NAME=$kind$suffix EPOCHS=4 TRAIN="$train" LIMIT=270 bash bench/gpu_run.sh route
  done
  for name in $(for kind in $order; do echo "$kind$suffix"; done); do
    python3 -c 'import json, sys
run = json.load(open(sys.argv[1]))[sys.argv[2]]
for r in run["records"]:
    print(sys.argv[2], r["epoch"], r.get("since_previous_epoch_seconds"), r["train_seconds"], r["val_seconds"])
print(sys.argv[2], "train job", run["job_seconds"].get("train/block_01"))' "$OUT/summary-$name.json" "$name" \
      | tee -a "$OUT/gaps.txt"
  done
fi

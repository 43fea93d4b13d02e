#!/usr/bin/env bash
# Do the train stage's runs on an empty compile cache draw other random numbers than runs on a filled one? Two epochs
# on a small set, cold then warm (bench/gpu_run.sh route, SHARE_CACHE=1), and their EpochLog rng_digests.
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
S="DATA=/dev/shm/small N_TRAIN=640 N_VAL=64 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1 SHARE_CACHE=1 EPOCHS=2"
rm -rf /tmp/compile-cache
env $S NAME=cold LIMIT=300 bash bench/gpu_run.sh route > /dev/null 2>&1
echo "cold: $(( $(date +%s) - start )) s" | tee "$OUT/times.txt"
env $S NAME=warm LIMIT=$(( 440 - ($(date +%s) - start) )) bash bench/gpu_run.sh route > /dev/null 2>&1
echo "warm: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
for name in cold warm; do
  find /tmp/r-$name -name epochs.json -path '*block_01*' -exec cp {} "$OUT/epochs-$name.json" \;
  python3 -c "import json,sys; [print(sys.argv[1], r['epoch'], r.get('rng_digests'), r['loss']) for r in json.load(open(sys.argv[2]))]" $name "$OUT/epochs-$name.json" 2>&1 | tee -a "$OUT/digests.txt"
done
rm -f "$OUT"/dmon-* "$OUT"/env-* "$OUT"/*.log "$OUT"/compare-*

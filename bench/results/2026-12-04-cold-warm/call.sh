#!/usr/bin/env bash
# Do the train stage's runs on an empty compile cache learn differently from runs on a filled one? More pairs of
# 2026-12-04-notebook/'s call 2: one block of three epochs on an empty cache (cold), then on the cache it left (warm).
# TAG names this call's pair; LOADER=1 first times the training loader alone at COCO's image sizes (bench.loader,
# 16 workers, uint8 as the train stage sends it).
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
tag=${TAG:?TAG names the pair}
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
data=/dev/shm/coco-prop
[ -f $data/annotations/instances_val2017.json ] || python3 bench/synth_coco.py $data 11829 500 --detail coco > /dev/null
echo "set: $(( $(date +%s) - start )) s" | tee -a "$OUT/times-$tag.txt"
if [ "${LOADER:-0}" = 1 ]; then
  for bytes in --images-as-bytes ""; do
    python3 -m bench.loader --dataset $data --workers 16 --waves 3 $bytes 2> /dev/null | tee -a "$OUT/loader.jsonl"
  done
  echo "loader: $(( $(date +%s) - start )) s" | tee -a "$OUT/times-$tag.txt"
fi
S="DATA=$data N_TRAIN=11829 N_VAL=500 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1 SHARE_CACHE=1 EPOCHS=3"
rm -rf /tmp/compile-cache
left=$(( 585 - ($(date +%s) - start) ))
env $S NAME=cold$tag LIMIT=$(( left < 330 ? left : 330 )) bash bench/gpu_run.sh route
echo "cold$tag: $(( $(date +%s) - start )) s" | tee -a "$OUT/times-$tag.txt"
env $S NAME=warm$tag LIMIT=$(( 585 - ($(date +%s) - start) )) bash bench/gpu_run.sh route
echo "warm$tag: $(( $(date +%s) - start )) s" | tee -a "$OUT/times-$tag.txt"
for name in cold$tag warm$tag; do tail -3 "$OUT/compare-$name.txt"; done
rm -f "$OUT"/dmon-* "$OUT"/env-* "$OUT"/*.log "$OUT"/compare-*

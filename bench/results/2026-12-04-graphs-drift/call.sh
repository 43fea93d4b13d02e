#!/usr/bin/env bash
# Do the train stage's CUDA graphs make some of its runs drift upward from the notebook's losses in their third
# epoch? Runs of the train stage (the h200 row, one block of three epochs, through snakemake) with every speedup but
# static_cuda_graphs: cuda_graphs then goes off (gpu_profiles' settle_profile) and rfdetr compiles for the one
# training shape, as the notebook does, with every other speedup in place.
#   PHASE=first: the set, one run on an empty compile cache, then two at once on the cache it left
#   PHASE=more:  three runs at once on that cache (a call right after the first)
#   PHASE=none:  with no speedup at all (train.speedups: none, stock rfdetr through the train stage): one run on an
#                empty compile cache, with the whole call (it compiles its validation graph too)
#   PHASE=none-more: two such runs at once on that cache (a call right after)
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
phase=${PHASE:?PHASE is first, more, none or none-more}
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
data=/dev/shm/coco-prop
[ -f $data/annotations/instances_val2017.json ] || python3 bench/synth_coco.py $data 11829 500 --detail coco > /dev/null
echo "$phase set: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
train=$(python3 -c 'import json, rfdetr_extensions as r
print(json.dumps({"speedups": [n for n in r.NAMES if n != "static_cuda_graphs"]}))')
case $phase in none*) train='{"speedups": "none"}' ;; esac
S="DATA=$data N_TRAIN=11829 N_VAL=500 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1 SHARE_CACHE=1 EPOCHS=3"
run() {  # NAME LIMIT
  env $S TRAIN="$train" NAME=$1 LIMIT=$2 bash bench/gpu_run.sh route
  echo "$1: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
}
left() { echo $(( 585 - ($(date +%s) - start) )); }
case $phase in
  first)
    rm -rf /tmp/compile-cache
    l=$(left); run offA $(( l < 330 ? l : 330 ))
    l=$(left); run offB $l & run offC $l & wait
    names="offA offB offC" ;;
  more)
    l=$(left); run offD $l & run offE $l & run offF $l & wait
    names="offD offE offF" ;;
  none)
    rm -rf /tmp/compile-cache
    run noneA $(left)
    names=noneA ;;
  none-more)
    l=$(left); run noneB $l & run noneC $l & wait
    names="noneB noneC" ;;
esac
for name in $names; do
  tail -3 "$OUT/compare-$name.txt"
  grep -h "CUDA graphs\|cuda_graphs" "$OUT/$name-block_01.log" | head -3
done > "$OUT/$phase-checks.txt" 2>&1
cat "$OUT/$phase-checks.txt"
tar czf "$OUT/$phase-logs.tgz" -C "$OUT" $(cd "$OUT" && ls *-block_01.log compare-*.txt 2>/dev/null)
rm -f "$OUT"/dmon-* "$OUT"/*.log "$OUT"/compare-*  # env-route.txt stays: the machine, torch and rfdetr

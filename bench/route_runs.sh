#!/usr/bin/env bash
# Several runs of the train stage (bench/gpu_run.sh route: the h200 row, one block of three epochs through snakemake,
# no compile warm-up, no evaluate, export or plot) on the set of COCO's train/validation proportion at COCO's image
# sizes, made first if /dev/shm lacks it, for comparing their per-step losses with the notebook's runs
# (bench.loss_pairs). Runs in one device call; back-to-back calls share /tmp's compile cache and /dev/shm's set.
#
# usage: OUT=DIR TAG=NAME NAMES="runA runB ..." [TRAIN='<train settings as JSON>' | TRAIN_SPEEDUPS=all,-NAME,+NAME] [COLD=1]
#        [FIRST_LIMIT=330] [LIMIT=<s>] bash bench/route_runs.sh
#   TRAIN_SPEEDUPS: train.speedups as the bench tools' --speedups takes it (bench.profile_steps): "all,-a,-b" is
#              every speedup that auto applies but a and b, "all,+c" adds c (TRAIN: the settings themselves;
#              neither: the route's own speedups)
#   COLD=1:    empty the compile cache, run the first name alone (at most FIRST_LIMIT seconds), then the others
#              on the cache it left; otherwise every name on the cache there is. The others run at once on a GPU of
#              100 GB or more (an H200), one after another on a smaller one, each with LIMIT seconds
#   LIMIT:     each run's limit in seconds (default: what is left of the call's 585 s)
# Leaves in OUT: summary-<name>.json, <TAG>-checks.txt (each run's last lines and the speedups and CUDA graphs its
# log reports), <TAG>-logs.tgz (the block logs and bench.compare's output), times.txt, env-route.txt.
set -u
cd "$(dirname "$0")/.."
start=$(date +%s)
tag=${TAG:?TAG names this call in times.txt and the checks}
read -r -a names <<< "${NAMES:?NAMES are the runs}"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/src
data=/dev/shm/coco-prop
[ -f $data/annotations/instances_val2017.json ] || python3 bench/synth_coco.py $data 11829 500 --detail coco > /dev/null
echo "$tag set: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
train=${TRAIN:-}
if [ -n "${TRAIN_SPEEDUPS:-}" ]; then
  train=$(python3 -c 'import json, sys; from bench.profile_steps import parse_speedups
print(json.dumps({"speedups": parse_speedups(sys.argv[1])}))' "$TRAIN_SPEEDUPS")
fi
S="DATA=$data N_TRAIN=11829 N_VAL=500 DETAIL=coco ROUTE=h200 TRAIN_ONLY=1 SHARE_CACHE=1 EPOCHS=3"
left() { echo $(( 585 - ($(date +%s) - start) )); }
settings=(); [ -n "$train" ] && settings=(TRAIN="$train")
run() {  # NAME LIMIT
  env $S "${settings[@]}" NAME=$1 LIMIT=$2 bash bench/gpu_run.sh route
  echo "$1: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
}
together=("${names[@]}")
if [ "${COLD:-0}" = 1 ]; then
  rm -rf /tmp/compile-cache
  first=${FIRST_LIMIT:-330}; l=$(left)
  run "${names[0]}" $(( l < first ? l : first ))
  together=("${names[@]:1}")
fi
# Two runs at once hold about 80 GB of GPU memory: on a GPU with less than 100 GB (an H100) they run one after another.
memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${memory_mib:-0}" -ge 100000 ]; then
  l=${LIMIT:-$(left)}
  for name in "${together[@]}"; do run "$name" "$l" & done
  wait
else
  for name in "${together[@]}"; do run "$name" "${LIMIT:-$(left)}"; done
fi
for name in "${names[@]}"; do
  tail -3 "$OUT/compare-$name.txt"
  grep -h "Speedups applied\|CUDA graphs\|cuda_graphs" "$OUT/$name-block_01.log" | head -3
done > "$OUT/$tag-checks.txt" 2>&1
cat "$OUT/$tag-checks.txt"
tar czf "$OUT/$tag-logs.tgz" -C "$OUT" $(cd "$OUT" && ls *-block_01.log compare-*.txt 2>/dev/null)
rm -f "$OUT"/dmon-* "$OUT"/*.log "$OUT"/compare-*  # env-route.txt stays: the machine, torch and rfdetr

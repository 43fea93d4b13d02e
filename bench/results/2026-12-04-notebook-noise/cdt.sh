#!/usr/bin/env bash
# Inductor's coordinate-descent tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1), compiled over several calls on one
# cache (/tmp/ind-cdt): each kernel's tuned config is cached as soon as it is found, so each call goes on where the
# last one stopped. The run is bench.profile_steps as in ../2026-12-03-cudnn-cdt/, on the set notebook.sh writes.
# DEADLINE: seconds since START (the call's start, date +%s) by which the run must have ended. BASE=1: then the same
# run without the setting, on its own empty cache (/tmp/ind-base), if it has time.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=/tmp/site:$PWD
tag=${TAG:?TAG names the call}
E="--dataset /dev/shm/coco-prop --threads 1 --loader-niceness 10 --speedups all --start 30 --steps 10"
left=$(( DEADLINE - ($(date +%s) - START) ))
run() {  # name, cache, environment...
  local name=$1 cache=$2 t0; shift 2
  t0=$(date +%s)
  env TORCHINDUCTOR_CACHE_DIR=$cache "$@" timeout -k 10 $left python3 -m bench.profile_steps $E --out "$OUT/$name-$tag.json" \
    > "$OUT/$name-$tag.log" 2>&1
  echo "$name rc=$? seconds=$(( $(date +%s) - t0 )) limit=$left" | tee -a "$OUT/runs.txt"
  tail -c 30000 "$OUT/$name-$tag.log" > "$OUT/$name-$tag.tail" && mv "$OUT/$name-$tag.tail" "$OUT/$name-$tag.log"
}
[ $left -gt 30 ] && run cdt /tmp/ind-cdt TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1
echo "kernels tuned by coordinate descent so far: $(grep -rl '"found_by_coordesc": true' /tmp/ind-cdt 2>/dev/null | wc -l)" \
  "of $(find /tmp/ind-cdt -name '*.best_config' 2>/dev/null | wc -l) configs cached" \
  | tee -a "$OUT/runs.txt"
left=$(( DEADLINE - ($(date +%s) - START) ))
[ "${BASE:-0}" = 1 ] && [ $left -gt 240 ] && run base /tmp/ind-base
exit 0

#!/usr/bin/env bash
# The notebook's run-to-run noise: more runs of its recipe (bench/stock_recipe.py through bench.compare --only stock),
# three epochs each on the set of COCO's train/validation proportion at COCO's image sizes, all on one compile cache
# (/tmp/stock-cache: empty for the call's first run, filled for the next call's). NAMES are started at once on the one
# GPU: their speed is no result here, their per-step losses are. LIMIT bounds each run in seconds.
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
data=/dev/shm/coco-prop
[ -f $data/annotations/instances_val2017.json ] || python3 bench/synth_coco.py $data 11829 500 --detail coco > /dev/null
echo "set: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
mkdir -p /tmp/stock-cache
for name in ${NAMES:?NAMES names the runs}; do
  mkdir -p "/tmp/nb-$name/stock" && ln -sfn /tmp/stock-cache "/tmp/nb-$name/stock/cache"
  CUDA_VISIBLE_DEVICES=0 timeout -k 20 "${LIMIT:?}" python3 -m bench.compare --dataset $data --out "/tmp/nb-$name" \
    --only stock --stock-epochs 3 > "$OUT/compare-$name.txt" 2>&1 &
done
wait
for name in $NAMES; do
  cp "/tmp/nb-$name/summary.json" "$OUT/summary-$name.json" || cp "/tmp/nb-$name/stock/epochs.jsonl" "$OUT/epochs-$name.jsonl"
  tail -c 20000 "/tmp/nb-$name/stock/stock.log" > "$OUT/$name.log"
done
echo "notebook runs $NAMES: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"

#!/usr/bin/env bash
# The notebook's recipe (bench/stock_recipe.py through bench.compare), three epochs on a set of COCO's
# train/validation proportion at COCO's image sizes, on an empty compile cache.
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
[ -f /dev/shm/coco-prop/annotations/instances_val2017.json ] || python3 bench/synth_coco.py /dev/shm/coco-prop 11829 500 --detail coco
echo "install and set: $(( $(date +%s) - start )) s" | tee "$OUT/times.txt"
DATA=/dev/shm/coco-prop EPOCHS=3 LIMIT=$(( 565 - ($(date +%s) - start) )) bash bench/gpu_run.sh stock > "$OUT/stock-run.txt" 2>&1
echo "stock: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
tail -25 "$OUT/stock-run.txt"

#!/usr/bin/env bash
# Validations of 5,000 images: the notebook's recipe (bench.compare --only stock, its validations as rfdetr runs them)
# and the train stage's (bench.validation --whole --eager --speedups all: every speedup, timed whole), one after the
# other on one set of 1,024 / 5,000 images at COCO's image sizes, three epochs each. ORDER=workflow-first|notebook-first.
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export DATA=/dev/shm/val5k
[ -f $DATA/annotations/instances_val2017.json ] || python3 bench/synth_coco.py $DATA 1024 5000 --detail coco
echo "install and set: $(elapsed) s" | tee "$OUT/times.txt"
workflow() {
  EPOCHS=3 LOADER_WORKERS=0 LIMIT=200 RUNS="all|--whole --eager --speedups all" bash bench/gpu_run.sh validation
  echo "workflow: $(elapsed) s" | tee -a "$OUT/times.txt"
}
notebook() {
  rm -rf /tmp/bench/stock/epochs.jsonl /tmp/bench/stock/*.ckpt /tmp/bench/summary.json
  EPOCHS=3 LIMIT=$(( ${1:-560} - $(elapsed) )) bash bench/gpu_run.sh stock > "$OUT/stock-run.txt" 2>&1
  echo "notebook: $(elapsed) s" | tee -a "$OUT/times.txt"
  cp /tmp/bench/stock/epochs.jsonl "$OUT/stock-epochs.jsonl"; cp /tmp/bench/stock/stock.log "$OUT/stock.log"
  cp /tmp/bench/summary.json "$OUT/summary-stock.json"
}
if [ "${ORDER:-workflow-first}" = workflow-first ]; then workflow; notebook 565; else notebook 360; workflow; fi
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for line in (out / "stock-epochs.jsonl").read_text().splitlines() if (out / "stock-epochs.jsonl").exists() else []:
    r = json.loads(line); print("notebook epoch", r["epoch"], "val_seconds", r["val_seconds"], r.get("validation"))
v = out / "validation-all.json"
if v.exists():
    for r in json.loads(v.read_text())["validations"]:
        print("workflow validation", r["images"], r["seconds"])
PY

# the compile warm-up then block 1 of the tiny GPU test's set, scripts called directly, cache lookups logged
set -u
DEV=${DEV:-cuda}; OUTD=${OUT:-/tmp/diag-out}; mkdir -p $OUTD
"${PY:-python3}" - <<'PY'
import json, os, yaml
from pathlib import Path
from tests.helpers.tiny_coco import make_dataset
from pipeline.recipe import RECIPE_KEYS
make_dataset(Path("/tmp/tiny"))
config = yaml.safe_load(open("config.yaml"))
config["train"].update(epochs=2, epochs_per_block=1, resolution=64, device=os.environ.get("DEV", "cuda"), max_workers=2,
                       profile="h200" if os.environ.get("DEV", "cuda") == "cuda" else "cpu")
Path("/tmp/diag-config.json").write_text(json.dumps(config))
Path("/tmp/diag-recipe.json").write_text(json.dumps({k: config["train"][k] for k in RECIPE_KEYS}))
Path("/tmp/diag-stage.json").write_text(json.dumps({"where": "disk", "path": "/tmp/tiny", "source": "/tmp/tiny"}))
PY
export PIPELINE_CONFIG="$(cat /tmp/diag-config.json)"
export TORCH_LOGS="dynamo,recompiles,torch._inductor.codecache,torch._functorch._aot_autograd.autograd_cache"
timeout 230 "${PY:-python3}" -m scripts.compile_warmup --recipe "$(cat /tmp/diag-recipe.json)" --dataset /tmp/tiny --state-root /tmp/st \
  --report $OUTD/warmup.json --threads 2 > $OUTD/warmup.log 2>&1
timeout 120 "${PY:-python3}" -m scripts.train --recipe "$(cat /tmp/diag-recipe.json)" --start-epoch 0 --end-epoch 1 --previous-block= \
  --stage-report /tmp/diag-stage.json --state-root /tmp/st --outdir /tmp/diag-block --threads 4 > $OUTD/train.log 2>&1
cp /tmp/diag-block/epochs.json $OUTD/ 2>/dev/null
for f in warmup train; do grep -v "it/s" $OUTD/$f.log | grep -E "cache (hit|miss)|start tracing|Recompiling|triggered by|compile_cache|lookups|Error" | cut -c1-300 > $OUTD/$f-lookups.txt; done
for f in $OUTD/*-lookups.txt; do tail -n 4 $f; done

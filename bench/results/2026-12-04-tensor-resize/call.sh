#!/usr/bin/env bash
# The training loader alone at COCO's image sizes, 16 workers: rfdetr's Pillow resizes against torch's uint8 resize
# (bench.loader --tensor-resize), alternated, uint8 images as the train stage sends them. Each result is written as
# it comes.
set -u
cd "$(dirname "$0")/../../.."
start=$(date +%s)
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
data=/dev/shm/loader6k
[ -f $data/annotations/instances_val2017.json ] || python3 bench/synth_coco.py $data 6144 16 --detail coco > /dev/null
echo "set: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
for round in 1 2; do
  for variant in "" --tensor-resize; do
    timeout 60 python3 -m bench.loader --dataset $data --workers 16 --waves 2 --images-as-bytes $variant 2> /dev/null \
      | tee -a "$OUT/loader.jsonl"
    echo "round $round ${variant:-pillow}: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
  done
done

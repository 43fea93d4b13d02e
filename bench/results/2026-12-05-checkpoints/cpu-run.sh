# The train stage through snakemake on the 2-core CPU host, 4 epochs in one block, stock rfdetr (speedups: none)
# against checkpoints_in_background alone, alternated twice. The set: python bench/synth_coco.py /tmp/tiny 16 8
set -e
cd "$(dirname "$0")/../../.."
for pass in 1 2; do
  for variant in without with; do
    if [ $variant = with ]; then S='["checkpoints_in_background"]'; else S='"none"'; fi
    .venv/bin/python -m bench.compare --dataset /tmp/tiny --out ${OUT:-/tmp/ckb}/out --only pipeline --device cpu \
      --resolution 64 --pipeline-epochs 4 --epochs-per-block 4 --train "{\"speedups\": $S}" --name $variant$pass \
      > ${OUT:-/tmp/ckb}/$variant$pass.txt 2>&1
  done
done
echo done

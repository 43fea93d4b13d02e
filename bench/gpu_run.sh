#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md, on a machine without network (the project's device machine).
# usage: bench/gpu_run.sh stock|pipeline|ddp|recompiles|levers|profile|route|validation  (OUT: results folder, default /tmp/bench-out;
#        N_TRAIN, N_VAL, DETAIL=photo|coco, [DISTINCT_TRAIN]: the synthetic set, bench/synth_coco.py, written to DATA if
#        it is not there)
#        stock:  [EPOCHS=2] [LIMIT=540] bench/gpu_run.sh stock  (the notebook's recipe, bench.compare --only stock)
#        route:  ROUTE=<gpu_profiles row> NAME=<name> [EPOCHS=3] [SHARE_CACHE=1] [TRAIN='<train settings as JSON>']
#                [COMPILE_WARMUP=1: the compile_warmup rule first] [TRAIN_ONLY=1: no evaluate, export, plot]
#                [GPUS=2: train.gpus, on GPUs 0 to GPUS-1] bench/gpu_run.sh route
#        levers: VARIANT='<a gpu_profiles row as JSON>' [TRAIN='<train settings as JSON>'] NAME=<name> [EPOCHS=3] [LOADER_WORKERS='16 32']
#                [SPLIT_CPUS=1: half the CPUs each] bench/gpu_run.sh levers
#        validation: [RUNS='name|bench.validation args;...'] [EPOCHS=2] bench/gpu_run.sh validation  (loader alone first: a
#                training wave and a whole validation pass; LOADER_WORKERS=0 skips both)
#        profile: PAIRS='name|args|name|args' [ONE_GPU=1] [LIMIT=400] bench/gpu_run.sh profile  (bench.profile_steps pairs)
#        parts:  [RUNS='name|VAR=value ...;...'] [KERNELS=12] [ONLY=REGEX] [ARGS=<more>] bench/gpu_run.sh parts  (bench.part_times, no data)
#        noise:  [EPOCHS=3] [SPLIT_CPUS=1] bench/gpu_run.sh noise   (the stock recipe twice, at once: its run-to-run noise)
#        (two GPUs)
# Needs the wheelhouse in .whl (../shared/gpu/wheelhouse.sh -d .whl) unless rfdetr and snakemake already import (after
# bench/fp8_offline.sh install); the data comes from bench/synth_coco.py.
set -euo pipefail
phase=$1
OUT=${OUT:-/tmp/bench-out}
DATA=${DATA:-/dev/shm/synth-coco}  # a second set (another DATA) can sit beside the first
mkdir -p "$OUT"
# Every run below is bounded by `timeout -k 30`: Lightning answers SIGTERM only at the end of the current step, so a
# run still compiling its first step would outlive a plain timeout; 30 s after the SIGTERM it gets a SIGKILL.
# the wheelhouse, unless the environment already holds the pipeline (after README's install, bench/fp8_offline.sh)
if [ ! -d /tmp/site ] && ! python3 -c 'import rfdetr, snakemake' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/src
if [ "$phase" != parts ] && [ ! -f "$DATA/annotations/instances_val2017.json" ]; then
  python3 bench/synth_coco.py "$DATA" "${N_TRAIN:-4096}" "${N_VAL:-500}" --detail "${DETAIL:-photo}" \
    ${DISTINCT_TRAIN:+--distinct-train "$DISTINCT_TRAIN"}
fi
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "rfdetr", m.version("rfdetr"), "snakemake", m.version("snakemake"))'
} > "$OUT/env-$phase.txt" 2>&1
# A log without its progress bars: each bar update becomes a line of its own, the bar is cut off, and what was printed
# right after it on the same line (a log message) is kept.
without_progress_bars() {
  stdbuf -oL tr '\r' '\n' | sed -u -E 's/^.*(it\/s|s\/it)[^]]*\]//' | grep --line-buffered -v '^[[:space:]]*$'
}
# SPLIT_CPUS=1: pin0/pin1 become taskset prefixes giving each of the two processes half the cores
# (bench/cpu_halves.py says why); otherwise both are empty and the processes share every core.
split_cpus() {
  pin0=; pin1=
  if [ "${SPLIT_CPUS:-0}" = 1 ]; then
    read -r cpus0 cpus1 < <(python3 -m bench.cpu_halves)
    pin0="taskset -c $cpus0"; pin1="taskset -c $cpus1"
    echo "GPU 0's process on CPUs $cpus0, GPU 1's on CPUs $cpus1" | tee -a "$OUT/env-$phase.txt"
  fi
}
case $phase in
  stock)    CUDA_VISIBLE_DEVICES=0 timeout -k 30 "${LIMIT:-540}" python3 -m bench.compare --dataset "$DATA" --out /tmp/bench \
              --only stock --stock-epochs "${EPOCHS:-2}" ;;
  pipeline) CUDA_VISIBLE_DEVICES=0 python3 -m bench.compare --dataset "$DATA" --out /tmp/bench --only pipeline --pipeline-epochs 4 --epochs-per-block 2 ;;
  recompiles)  # stock and pipeline side by side, one GPU each, one epoch, cold caches, recompiles logged
            export TORCH_LOGS=recompiles
            CUDA_VISIBLE_DEVICES=0 python3 -m bench.compare --dataset "$DATA" --out /tmp/bench-rs --only stock \
              --stock-epochs 1 > "$OUT/recompiles-stock.txt" 2>&1 &
            CUDA_VISIBLE_DEVICES=1 python3 -m bench.compare --dataset "$DATA" --out /tmp/bench-rp --only pipeline \
              --pipeline-epochs 1 --epochs-per-block 1 > "$OUT/recompiles-pipeline.txt" 2>&1
            wait
            for f in /tmp/bench-rs/stock/stock.log /tmp/bench-rp/pipeline/results/logs/train/block_01.log; do
              echo "$f: $(grep -c 'Recompiling function' "$f") recompiles"; grep -A3 'Recompiling function' "$f" | grep -E 'triggered by|guard' | sort | uniq -c | sort -rn | head -12
            done > "$OUT/recompiles.txt"
            cat "$OUT/recompiles.txt"; exit 0 ;;
  ddp)      EAGER='{"batch_size": 128, "precision": "bf16", "compile": false, "cuda_graphs": false}'
            for g in 1 2; do
              python3 -m bench.compare --dataset "$DATA" --out /tmp/bench --only pipeline --name "eager_${g}gpu" \
                --bench-profile "$EAGER" --gpus "$g" --pipeline-epochs 2 --epochs-per-block 2
            done ;;
  profile)  # bench.profile_steps, two variants side by side per line of PAIRS ("name|args|name|args"): GPU 0, GPU 1
            # (ONE_GPU=1: one after the other on GPU 0, for a machine of one GPU); each process limited to LIMIT
            # seconds; traces are read here (bench.trace_ops) and kept only with KEEP_TRACES=1
            nvidia-smi dmon -s u -d 1 > "$OUT/dmon-profile.txt" 2>&1 & dmon=$!
            second_gpu=1; [ "${ONE_GPU:-0}" = 1 ] && second_gpu=0
            while IFS='|' read -r name0 args0 name1 args1; do
              CUDA_VISIBLE_DEVICES=0 timeout -k 30 "${LIMIT:-400}" python3 -m bench.profile_steps --dataset "$DATA" $args0 \
                --out "$OUT/profile-$name0.json" --trace > "/tmp/profile-$name0.log" 2>&1 & first=$!
              [ "$second_gpu" = 0 ] && { wait $first || echo "$name0 failed: $?"; }
              CUDA_VISIBLE_DEVICES=$second_gpu timeout -k 30 "${LIMIT:-400}" python3 -m bench.profile_steps --dataset "$DATA" $args1 \
                --out "$OUT/profile-$name1.json" --trace > "/tmp/profile-$name1.log" 2>&1 || echo "$name1 failed: $?"
              [ "$second_gpu" = 0 ] || wait $first || echo "$name0 failed: $?"
              for name in "$name0" "$name1"; do
                trace="$OUT/profile-$name.trace.json.gz"
                [ -f "$trace" ] && python3 -m bench.trace_ops "$trace" --top 40 > "$OUT/trace-$name.json" 2>&1
                [ "${KEEP_TRACES:-0}" = 1 ] || rm -f "$trace"
              done
            done <<< "${PAIRS:-stock||matches_on_device|--matches-on-device}"
            kill $dmon || true
            for f in /tmp/profile-*.log; do without_progress_bars < "$f" | tail -c 50000 > "$OUT/$(basename "$f")"; done
            exit 0 ;;
  route)    # the train stage alone on GPU 0 (GPUS=2: DDP on GPUs 0-1) with the gpu_profiles row ROUTE, EPOCHS epochs
            # in one block (NAME names the run); runs of one machine share the compile cache in /tmp/compile-cache when
            # SHARE_CACHE=1
            name=${NAME:?NAME names the run}
            [ "${SHARE_CACHE:-0}" = 1 ] && export TORCHINDUCTOR_CACHE_DIR=/tmp/compile-cache/inductor TRITON_CACHE_DIR=/tmp/compile-cache/triton
            nvidia-smi dmon -s u -d 2 > "$OUT/dmon-$name.txt" 2>&1 & dmon=$!
            gpus=${GPUS:-1}
            CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((gpus - 1))) timeout -k 30 "${LIMIT:-540}" python3 -m bench.compare \
              --dataset "$DATA" --out "/tmp/r-$name" --gpus "$gpus" \
              --only pipeline --name "$name" --profile "${ROUTE:?ROUTE names a gpu_profiles row}" --train "${TRAIN:-{\}}" \
              --pipeline-epochs "${EPOCHS:-3}" --epochs-per-block "${EPOCHS:-3}" \
              $([ "${COMPILE_WARMUP:-0}" = 1 ] && echo --compile-warmup) $([ "${TRAIN_ONLY:-0}" = 1 ] && echo --train-only) \
              > "$OUT/compare-$name.txt" 2>&1 \
              || echo "failed: $?" >> "$OUT/compare-$name.txt"
            kill $dmon || true
            cp "/tmp/r-$name/summary.json" "$OUT/summary-$name.json" || true
            for f in block_01 compile_warmup; do
              log=/tmp/r-$name/$name/results/logs/train/$f.log; [ -f "$log" ] && tail -c 200000 "$log" > "$OUT/$name-$f.log"
            done
            exit 0 ;;
  validation)  # the data loader alone (LOADER_WORKERS=16; 0 skips it), then bench.validation for each run of RUNS, one
            # after the other on GPU 0, sharing one compile cache (the first run compiles cold, the next ones find its graphs);
            # each run's log goes straight to $OUT, so what ran comes back even when the call's time runs out
            workers=${LOADER_WORKERS:-16}
            [ "$workers" = 0 ] || python3 -m bench.loader --dataset "$DATA" --workers "$workers" --waves 2 > "$OUT/loader.json" 2> "$OUT/loader.log" || true
            # the validation set's whole pass, uint8 as the train stage sends it: the least time a validation can take
            [ "$workers" = 0 ] || python3 -m bench.loader --dataset "$DATA" --split val --workers "$workers" --images-as-bytes > "$OUT/loader-val.json" 2>> "$OUT/loader.log" || true
            export TORCHINDUCTOR_CACHE_DIR=/tmp/compile-cache/inductor TRITON_CACHE_DIR=/tmp/compile-cache/triton
            nvidia-smi dmon -s u -d 1 > "$OUT/dmon-validation.txt" 2>&1 & dmon=$!
            IFS=';' read -ra runs <<< "${RUNS:-before|--speedups all}"
            for run in "${runs[@]}"; do
              name=${run%%|*}; args=${run#*|}
              { CUDA_VISIBLE_DEVICES=0 TORCH_LOGS=recompiles timeout -k 30 "${LIMIT:-420}" python3 -m bench.validation --dataset "$DATA" \
                  --out "$OUT/validation-$name.json" --state "/tmp/v-$name" --epochs "${EPOCHS:-2}" $args 2>&1 || echo "$name failed: $?"; } \
                | without_progress_bars > "$OUT/validation-$name.log"
            done
            kill $dmon || true
            exit 0 ;;
  parts)    # bench.part_times for each run of RUNS, one after the other on GPU 0: "name|environment", the environment
            # as VAR=value words (Inductor's settings, for example); the first run is the baseline. Each run's table
            # and log go straight to $OUT, so what ran comes back even when the call's time runs out
            IFS=';' read -ra runs <<< "${RUNS:-base|}"
            for run in "${runs[@]}"; do
              name=${run%%|*}; environment=${run#*|}
              env $environment CUDA_VISIBLE_DEVICES=0 timeout -k 30 "${LIMIT:-500}" python3 -m bench.part_times \
                --kernels "${KERNELS:-12}" --only "${ONLY:-.*}" ${ARGS:-} --out "$OUT/parts-$name.json" > "$OUT/parts-$name.log" 2>&1 \
                || echo "$name failed: $?" >> "$OUT/parts-$name.log"
            done
            exit 0 ;;
  noise)    # the stock recipe on GPU 0 and GPU 1 at the same time, same set, seed and epochs: how far two runs of
            # the same recipe drift apart step by step, to read a lever's loss differences against (bench.side_by_side)
            epochs=${EPOCHS:-3}; split_cpus
            for gpu in 0 1; do
              pin=pin$gpu
              CUDA_VISIBLE_DEVICES=$gpu ${!pin} timeout -k 30 "${LIMIT:-520}" python3 -m bench.compare --dataset "$DATA" \
                --out "/tmp/n-stock$gpu" --only stock --stock-epochs "$epochs" > "$OUT/compare-noise-stock$gpu.txt" 2>&1 &
            done
            wait || true
            for gpu in 0 1; do cp "/tmp/n-stock$gpu/summary.json" "$OUT/summary-noise-stock$gpu.json" || true; done
            python3 -m bench.side_by_side --out "$OUT/noise" /tmp/n-stock0/summary.json /tmp/n-stock1/summary.json
            exit 0 ;;
  levers)   # the stock recipe on GPU 0 and the workflow with the profile row VARIANT on GPU 1, at the same time,
            # same set, seed and epochs; then speed ratios and per-step loss differences (bench.side_by_side)
            name=${NAME:?NAME names the variant}; epochs=${EPOCHS:-3}
            for workers in ${LOADER_WORKERS:-16}; do  # the data loader alone, before any training starts (0: skip)
              [ "$workers" = 0 ] && continue
              python3 -m bench.loader --dataset "$DATA" --workers "$workers" --batch "${LOADER_BATCH:-128}" >> "$OUT/loader.json" 2> "$OUT/loader.log" || true
            done
            split_cpus  # the stock recipe on GPU 0, the workflow on GPU 1
            nvidia-smi dmon -s u -d 2 > "$OUT/dmon-$name.txt" 2>&1 & dmon=$!
            CUDA_VISIBLE_DEVICES=0 $pin0 timeout -k 30 "${LIMIT:-520}" python3 -m bench.compare --dataset "$DATA" \
              --out "/tmp/b-$name-stock" --only stock --stock-epochs "$epochs" > "$OUT/compare-$name-stock.txt" 2>&1 & stock=$!
            CUDA_VISIBLE_DEVICES=1 $pin1 timeout -k 30 "${LIMIT:-520}" python3 -m bench.compare --dataset "$DATA" --out "/tmp/b-$name" \
              --only pipeline --name "$name" --bench-profile "$VARIANT" --train "${TRAIN:-{\}}" --pipeline-epochs "$epochs" \
              --epochs-per-block "$epochs" > "$OUT/compare-$name.txt" 2>&1 || echo "variant failed: $?" >> "$OUT/compare-$name.txt"
            wait $stock || echo "stock failed: $?" >> "$OUT/compare-$name-stock.txt"
            kill $dmon || true
            for f in /tmp/b-$name-stock/stock/stock.log /tmp/b-$name/$name/snakemake.log /tmp/b-$name/$name/results/logs/train/block_01.log; do
              [ -f "$f" ] && tail -c 300000 "$f" > "$OUT/$name-$(basename "$(dirname "$f")")-$(basename "$f")"
            done
            cp /tmp/b-$name-stock/summary.json "$OUT/summary-$name-stock.json" || true
            cp /tmp/b-$name/summary.json "$OUT/summary-$name.json" || true
            python3 -m bench.side_by_side --out "$OUT/$name" /tmp/b-$name-stock/summary.json /tmp/b-$name/summary.json
            exit 0 ;;
esac
cp /tmp/bench/summary.json "$OUT/summary-$phase.json"
for f in /tmp/bench/*/stock.log /tmp/bench/*/results/logs/train/block_0[12].log; do
  [ -f "$f" ] && tail -c 200000 "$f" > "$OUT/$(echo "$f" | cut -d/ -f4)-$(basename "$f")"
done
ls -la "$OUT"

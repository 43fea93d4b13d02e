#!/usr/bin/env bash
# The CPU host's calls of precompile_cpu.py on one fresh cache (NOTES.md). Results in $OUT/<call>.json.
set -u
cd "$(dirname "$0")"
export TORCHINDUCTOR_CACHE_DIR=${CACHE:-/tmp/precompile-cache}
rm -rf "$TORCHINDUCTOR_CACHE_DIR"; mkdir -p "$OUT"
run() { name=$1; shift; /usr/bin/time -f "%e s wall" python precompile_cpu.py "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"; tail -1 "$OUT/$name.log"; }
run cold-precompile --precompile --save   # fills Inductor's, AOTAutograd's and the Dynamo cache
run warm-plain                            # a new process on those caches: Dynamo traces again
run warm-precompile --precompile          # the same with the Dynamo cache: tracing skipped, if it works
run warm-plain2
run warm-precompile2 --precompile

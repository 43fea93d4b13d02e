#!/usr/bin/env bash
# Do the train stage's CUDA graphs make some of its runs drift upward from the notebook's losses in their third
# epoch? Runs of the train stage through bench/route_runs.sh (one block of three epochs on the set of COCO's
# proportion at COCO's image sizes) with every speedup but static_cuda_graphs: cuda_graphs then goes off
# (gpu_profiles' settle_profile) and rfdetr compiles for the one training shape, as the notebook does, with every
# other speedup in place.
#   PHASE=first: the set, one run on an empty compile cache, then two at once on the cache it left
#   PHASE=more:  three runs at once on that cache (a call right after the first)
# The runs with no speedup at all (train.speedups: none) are ../2026-12-04-drift-cause/call.sh's.
set -u
here=$(dirname "$0")/../..
case ${PHASE:?PHASE is first or more} in
  first) COLD=1 NAMES="offA offB offC" ;;
  more) COLD=0 NAMES="offD offE offF" ;;
esac
TAG=$PHASE TRAIN_BUT=static_cuda_graphs COLD=$COLD NAMES=$NAMES bash "$here/route_runs.sh"

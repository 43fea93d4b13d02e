#!/usr/bin/env bash
# What makes the train stage's losses spread wider than the notebook's? Runs of the train stage through
# bench/route_runs.sh (one block of three epochs on the set of COCO's proportion at COCO's image sizes):
#   PHASE=none:          train.speedups none (stock rfdetr through the train stage), one run on an empty compile cache
#                        with the whole call (stock rfdetr compiles its validation graph too)
#   PHASE=none-more:     three such runs at once on that cache (the call right after)
#   PHASE=nodeform:      every speedup but deformable_sampling: one run on a cache without its graphs, then two at once
#   PHASE=nodeform-more: two more at once on that cache [LIMIT=250 seconds each] (the call right after)
set -u
here=$(dirname "$0")/../..
case ${PHASE:?PHASE is none, none-more, nodeform or nodeform-more} in
  none) TRAIN='{"speedups": "none"}' COLD=1 FIRST_LIMIT=585 NAMES=noneA ;;
  none-more) TRAIN='{"speedups": "none"}' NAMES="noneB noneC noneD" ;;
  nodeform) TRAIN_BUT=deformable_sampling COLD=1 NAMES="nodefA nodefB nodefC" ;;
  nodeform-more) TRAIN_BUT=deformable_sampling LIMIT=${LIMIT:-250} NAMES="nodefD nodefE" ;;
esac
TAG=$PHASE TRAIN=${TRAIN:-} TRAIN_BUT=${TRAIN_BUT:-} COLD=${COLD:-0} FIRST_LIMIT=${FIRST_LIMIT:-330} LIMIT=${LIMIT:-} \
  NAMES=$NAMES bash "$here/route_runs.sh"

"""How long one full garbage collection stops the training process, before and after `gc.freeze()`.

usage: python -m bench.full_collection [--resolution 384]

Builds rfdetr's Nano as the train stage does (no compile: that would take minutes on a CPU and only add objects),
then times full collections (the best of 3) with every object tracked, and after `gc.freeze()` as
the gc_freeze speedup does it during training.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from rfdetr_coco_pipeline.common import run_stage


def full_collection_seconds(repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - started)
    return round(best, 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolution", type=int, default=384)
    args = parser.parse_args()
    from rfdetr import RFDETRNano

    model = RFDETRNano(pretrain_weights=None, resolution=args.resolution)
    tracked = len(gc.get_objects())
    before = full_collection_seconds()
    gc.freeze()
    after = full_collection_seconds()
    gc.unfreeze()
    print(json.dumps({"tracked_objects": tracked, "full_collection_seconds": before, "after_freeze": after}))
    del model


if __name__ == "__main__":
    run_stage(main)

"""How long the `matching_in_workers` pool takes to return its first result (its fork server and worker start,
importing torch and rfdetr) and a second one. Run on the 2-core CPU host with
`PYTHONPATH=. python bench/results/2026-12-02-coco-proportion/cpu-matching-pool-start.py`; output in
cpu-matching-pool-start.txt."""

import time

import torch
from rfdetr_extensions.patches.matching_in_workers import MatchingPool

from tests.test_validation_metrics import batch


def main() -> None:
    pool = MatchingPool(workers=1)
    preds, targets = batch(torch.Generator().manual_seed(1), 2)
    try:
        for which in ("first", "second"):
            start = time.perf_counter()
            pool.submit(preds, targets, 0.5).result(timeout=300)
            print(f"{which} result {time.perf_counter() - start:.2f} s")
    finally:
        pool.close()


if __name__ == "__main__":
    main()

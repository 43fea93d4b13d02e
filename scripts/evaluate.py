#!/usr/bin/env python3
"""Evaluate the best weights on val2017 with rfdetr's COCO evaluation (rule evaluate)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.evaluation import EvaluationFiles, evaluate_run
from rfdetr_coco_pipeline.settings import job_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", required=True, type=Path, help="the last block's best.pth")
    parser.add_argument("--run", required=True, type=Path, help="the last block's run.json (its GPU profile)")
    parser.add_argument("--dataset", required=True, type=Path, help="the verified dataset (val2017/, annotations/)")
    for name in ("--metrics", "--per-class", "--figure", "--page"):
        parser.add_argument(name, required=True, type=Path)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    files = EvaluationFiles(args.metrics, args.per_class, args.figure, args.page)
    evaluate_run(job_settings(), args.weights, args.run, args.dataset, files, args.workers)


if __name__ == "__main__":
    run_stage(main)

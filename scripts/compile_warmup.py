#!/usr/bin/env python3
"""Compile the training step's graphs into the run's compile cache beside the download (rule compile_warmup)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage, where_this_runs, write_json
from rfdetr_coco_pipeline.settings import job_settings
from rfdetr_coco_pipeline.training.compile_warmup import warm_up
from rfdetr_coco_pipeline.versions import package_version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", required=True, type=Path, help="the dataset folder (val2017/, annotations/)")
    parser.add_argument("--report", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=2, help="data-loader workers of the warm-up's training")
    args = parser.parse_args()
    report = warm_up(job_settings(), args.dataset, args.threads, package_version("rfdetr"))
    write_json(args.report, {**report, **where_this_runs()})


if __name__ == "__main__":
    run_stage(main)

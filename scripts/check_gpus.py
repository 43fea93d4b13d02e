#!/usr/bin/env python3
"""Check, where training will run, that the GPUs it needs are there, before the first download (rule check_gpus)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage, where_this_runs, write_json
from rfdetr_coco_pipeline.needs import check_gpus
from rfdetr_coco_pipeline.settings import job_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--report", required=True, type=Path)
    args = parser.parse_args()
    write_json(args.report, {**check_gpus(job_settings()), **where_this_runs()})


if __name__ == "__main__":
    run_stage(main)

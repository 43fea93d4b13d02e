#!/usr/bin/env python3
"""Extract one archive into its dataset folder, which appears only once complete (rule extract_archive)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.data.extract import extract_archive
from rfdetr_coco_pipeline.settings import job_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archive", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path, help="the folder the archive holds, e.g. .../val2017")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    extract_archive(job_settings(), args.archive, args.output, max(1, args.workers))


if __name__ == "__main__":
    run_stage(main)

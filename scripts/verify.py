#!/usr/bin/env python3
"""Check image counts, annotations and JPEGs before any GPU time is spent (rule verify_counts)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage, write_json
from rfdetr_coco_pipeline.data.verify import verify_dataset
from rfdetr_coco_pipeline.settings import job_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--report", required=True, type=Path)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    verify = job_settings().verify
    expected = verify.expected_images.model_dump()
    report = verify_dataset(args.dataset, expected, verify.decode_images, args.workers, verify.unlisted_images)
    write_json(args.report, report)


if __name__ == "__main__":
    run_stage(main)

#!/usr/bin/env python3
"""Download one COCO archive, resumable and MD5-checked (rule download_archive)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.data.download import download_archive
from rfdetr_coco_pipeline.settings import job_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archive", required=True, help="its name under archives in config.yaml")
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args()
    download_archive(job_settings(), args.archive, args.output)


if __name__ == "__main__":
    run_stage(main)

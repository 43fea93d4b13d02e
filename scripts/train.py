#!/usr/bin/env python3
"""Train one block of epochs of RF-DETR Nano, resuming where the run stopped (rule train_block)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.settings import job_settings
from rfdetr_coco_pipeline.training.block import BlockJob, train_block
from rfdetr_coco_pipeline.training.ranks import die_with_parent
from rfdetr_coco_pipeline.versions import package_version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--block", required=True, help="block_01, block_02, ...")
    parser.add_argument("--stage-report", required=True, type=Path, help="stage.json: where the dataset is")
    parser.add_argument(
        "--previous-block", type=lambda path: Path(path) if path else None, help="the previous block's output folder"
    )
    parser.add_argument("--outdir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    die_with_parent()  # rank 0 ends with the job's shell, the ranks Lightning starts with rank 0
    job = BlockJob(args.block, args.stage_report, args.previous_block, args.outdir, args.threads)
    train_block(job_settings(), job, package_version("rfdetr"))


if __name__ == "__main__":
    run_stage(main)

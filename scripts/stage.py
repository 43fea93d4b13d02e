#!/usr/bin/env python3
"""Copy the verified dataset to this node's RAM disk when it fits (the start of every training job)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage, write_json
from rfdetr_coco_pipeline.data.stage import stage_dataset, this_nodes_report
from rfdetr_coco_pipeline.settings import job_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True, type=Path, help="the verified dataset on disk")
    parser.add_argument("--report", required=True, type=Path, help="stage.json: the folder to train from")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    stage = job_settings().stage
    headroom = int(stage.headroom_gb * 2**30)
    report = stage_dataset(args.source, stage.ramdisk, stage.subdir, headroom, stage.enabled, args.workers)
    write_json(this_nodes_report(args.report), report)


if __name__ == "__main__":
    run_stage(main)

#!/usr/bin/env python3
"""Write the report's first page: the run's headline, its COCO numbers and its figure (rule front_page)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.front_page import write_front_page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("--summary", "--evaluation", "--figure", "--output"):
        parser.add_argument(name, required=True, type=Path)
    args = parser.parse_args()
    write_front_page(args.summary, args.evaluation, args.figure, args.output)


if __name__ == "__main__":
    run_stage(main)

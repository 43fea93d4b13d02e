#!/usr/bin/env python3
"""Export the best weights with rfdetr's export(), one format per job (rule export_model)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.export import EXTRA, export_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", required=True, type=Path, help="the last block's best.pth")
    parser.add_argument("--format", required=True, choices=sorted(EXTRA))
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args()
    export_weights(args.weights, args.format, args.output)


if __name__ == "__main__":
    run_stage(main)

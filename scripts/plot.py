#!/usr/bin/env python3
"""Join the blocks' metrics, plot them and write the summary and the report's pages (rule plot_metrics)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.plotting import PlotFiles, plot_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", required=True, nargs="+", type=Path, help="block output folders, in order")
    outputs = ("--metrics", "--training-plot", "--loss-plot", "--map-plot", "--summary", "--epochs-page", "--run-page")
    for name in outputs:
        parser.add_argument(name, required=True, type=Path)
    args = parser.parse_args()
    files = PlotFiles(*(getattr(args, name.removeprefix("--").replace("-", "_")) for name in outputs))
    plot_run(args.blocks, files)


if __name__ == "__main__":
    run_stage(main)

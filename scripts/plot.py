#!/usr/bin/env python3
"""Join the blocks' metrics, plot them and write the summary and the report's pages (rule plot_metrics)."""

import argparse
from pathlib import Path

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.plotting import PlotFiles, plot_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", required=True, nargs="+", type=Path, help="block output folders, in order")
    for name in ("--metrics", "--loss-plot", "--map-plot", "--summary", "--epochs-page", "--run-page"):
        parser.add_argument(name, required=True, type=Path)
    args = parser.parse_args()
    files = PlotFiles(args.metrics, args.loss_plot, args.map_plot, args.summary, args.epochs_page, args.run_page)
    plot_run(args.blocks, files)


if __name__ == "__main__":
    run_stage(main)

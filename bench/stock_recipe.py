"""The reference notebook's training call, unchanged, with the workflow's epoch log (`EpochLog`).

usage: python -m bench.stock_recipe --dataset DIR --output DIR --epochs N [--batch 128] [--workers N]
           [--resolution N] [--num-queries N]
Writes <output>/epochs.jsonl: per epoch train seconds, images/s, validation seconds, peak GPU memory, and every
step's learning rate and loss. `--workers`, `--resolution` and `--num-queries` default to the notebook's (min(cores,
16), 384 px, rfdetr's 300 queries a group); the tests set them to compare this call with the train rule's on a tiny set
on the CPU, whose GPU profile row sets its own query count.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rfdetr_coco_pipeline.common import run_stage


def train_like_notebook(
    dataset: str,
    output: Path,
    epochs: int,
    batch: int,
    callbacks: list[Any],
    compile: bool | None = None,
    cuda_graphs: bool | None = None,
    resolution: int | None = None,
    workers: int | None = None,
    use_te_graphs: bool = False,
    num_queries: int | None = None,
) -> None:
    """The notebook's model and `train()` cell. Arguments left at None keep the notebook's values;
    bench.profile_steps sets `compile` and `cuda_graphs` to profile a variant, the tests `resolution` and `workers`
    (a resolution is passed to `train()`, as the workflow passes it) and `num_queries` (passed to the model, as the
    workflow passes a profile's). `use_te_graphs` is the notebook's
    USE_TE_GRAPHS: the Transformer Engine FP8 graph route."""
    import pytorch_lightning as pl
    from rfdetr import RFDETRNano

    from rfdetr_coco_pipeline.training.callbacks import attached

    # The notebook leaves the model's initialisation unseeded (its train() seeds only after the model is built).
    # Seeding it with the training seed, as the workflow does, makes loss curves comparable step by step.
    pl.seed_everything(0, workers=True)
    model = RFDETRNano(
        compile=(not use_te_graphs) if compile is None else compile,
        cuda_graphs=(use_te_graphs or batch <= 16) if cuda_graphs is None else cuda_graphs,
        pretrain_weights=None,
        **({"num_queries": num_queries} if num_queries else {}),
    )
    sized = {"resolution": resolution} if resolution else {}
    with attached(callbacks):
        model.train(  # the notebook's cell, with its EPOCHS, BATCH_SIZE, dataset and output folder as arguments
            dataset_file="coco",
            dataset_dir=dataset,
            output_dir=str(output),
            epochs=epochs,
            batch_size=batch,
            num_workers=min(os.cpu_count() or 2, 16) if workers is None else workers,
            seed=0,
            lr_scheduler="cosine",
            warmup_epochs=1,
            tensorboard=False,
            progress_bar="tqdm",
            amp_dtype="fp8" if use_te_graphs else "auto",
            grad_accum_steps=1,
            multi_scale=False,
            square_resize_div_64=True,
            **sized,
        )


def main() -> None:
    from rfdetr_coco_pipeline.training.callbacks.block_end import StopAtBlockEnd
    from rfdetr_coco_pipeline.training.callbacks.epoch_log import EpochLog

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--workers", type=int, help="data-loader workers (default: the notebook's min(cores, 16))")
    parser.add_argument("--resolution", type=int, help="input size in pixels (default: the notebook's 384)")
    parser.add_argument("--num-queries", type=int, help="decoder queries per group (default: rfdetr's 300)")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    callbacks = [StopAtBlockEnd(args.epochs), EpochLog(args.output / "epochs.jsonl")]
    train_like_notebook(
        args.dataset,
        args.output,
        args.epochs,
        args.batch,
        callbacks,
        resolution=args.resolution,
        workers=args.workers,
        num_queries=args.num_queries,
    )


if __name__ == "__main__":
    run_stage(main)

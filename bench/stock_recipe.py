"""The reference notebook's training call, unchanged, with a timing callback (the pipeline's own EpochLog).

usage: python -m bench.stock_recipe --dataset DIR --output DIR --epochs N [--batch 128]
Writes <output>/epochs.jsonl: per epoch train seconds, images/s, validation seconds, peak GPU memory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scripts.common import run_main
from scripts.train import extra_callbacks, lightning_callbacks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    import pytorch_lightning as pl
    from rfdetr import RFDETRNano

    # The notebook leaves the model's initialisation unseeded (its train() seeds only after the model is built).
    # Seeding it with the training seed, as the workflow does, makes loss curves comparable step by step.
    pl.seed_everything(0, workers=True)
    use_te_graphs = False
    model = RFDETRNano(compile=not use_te_graphs, cuda_graphs=use_te_graphs or args.batch <= 16, pretrain_weights=None)
    with extra_callbacks(lightning_callbacks(args.epochs, args.output / "epochs.jsonl")):
        model.train(  # the notebook's cell, with its EPOCHS, BATCH_SIZE, dataset and output folder as arguments
            dataset_file="coco",
            dataset_dir=args.dataset,
            output_dir=str(args.output),
            epochs=args.epochs,
            batch_size=args.batch,
            num_workers=min(os.cpu_count() or 2, 16),
            seed=0,
            lr_scheduler="cosine",
            warmup_epochs=1,
            tensorboard=False,
            progress_bar="tqdm",
            amp_dtype="fp8" if use_te_graphs else "auto",
            grad_accum_steps=1,
            multi_scale=False,
            square_resize_div_64=True,
        )


if __name__ == "__main__":
    run_main(main)

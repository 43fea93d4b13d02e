"""The reference notebook's training call, unchanged, with a timing callback (the pipeline's own EpochLog).

usage: python -m bench.stock_recipe --dataset DIR --output DIR --epochs N [--batch 128]
Writes <output>/epochs.jsonl: per epoch train seconds, images/s, validation seconds, peak GPU memory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from scripts.common import run_main
from scripts.train import extra_callbacks, lightning_callbacks


def train_like_notebook(
    dataset: str,
    output: Path,
    epochs: int,
    batch: int,
    callbacks: list[Any],
    compile: bool | None = None,
    cuda_graphs: bool | None = None,
    resolution: int | None = None,
) -> None:
    """The notebook's model and `train()` cell. `compile`, `cuda_graphs` and `resolution` left at None keep the
    notebook's values; bench.profile_steps sets them to profile a variant (or to run on a CPU)."""
    import pytorch_lightning as pl
    from rfdetr import RFDETRNano

    # The notebook leaves the model's initialisation unseeded (its train() seeds only after the model is built).
    # Seeding it with the training seed, as the workflow does, makes loss curves comparable step by step.
    pl.seed_everything(0, workers=True)
    use_te_graphs = False
    model_kwargs: dict[str, Any] = {"resolution": resolution} if resolution else {}
    model = RFDETRNano(
        compile=(not use_te_graphs) if compile is None else compile,
        cuda_graphs=(use_te_graphs or batch <= 16) if cuda_graphs is None else cuda_graphs,
        pretrain_weights=None,
        **model_kwargs,
    )
    with extra_callbacks(callbacks):
        model.train(  # the notebook's cell, with its EPOCHS, BATCH_SIZE, dataset and output folder as arguments
            dataset_file="coco",
            dataset_dir=dataset,
            output_dir=str(output),
            epochs=epochs,
            batch_size=batch,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    callbacks = lightning_callbacks(args.epochs, args.output / "epochs.jsonl")
    train_like_notebook(args.dataset, args.output, args.epochs, args.batch, callbacks)


if __name__ == "__main__":
    run_main(main)

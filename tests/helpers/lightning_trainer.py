"""A small Lightning Trainer, set up as rfdetr's in what the callbacks' and patches' tests depend on."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def small_trainer(root: Path, callbacks: list[Any], max_epochs: int, accelerator: str = "cpu", **settings: Any) -> Any:
    """One device, no logger, checkpoints or progress bar; no sanity validation, as rfdetr's trainer."""
    import pytorch_lightning as pl

    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator=accelerator,
        devices=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        **settings,
    )

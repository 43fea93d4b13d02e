"""A small Lightning Trainer on the CPU, set up as rfdetr's in what the loader callbacks' tests depend on."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_trainer(root: Path, callbacks: list[Any], max_epochs: int, **settings: Any) -> Any:
    """No logger, checkpoints or progress bar; no sanity validation, as rfdetr's trainer."""
    import pytorch_lightning as pl

    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        **settings,
    )

"""End a training call at the end of its block of epochs, keeping the learning-rate schedule of the whole run.

rfdetr sizes its cosine schedule from the `epochs` it is given, so every block calls `train()` with the run's
full epoch count; `StopAtBlockEnd` then stops Lightning after the block's last epoch, once that epoch's validation
and checkpoint are done.
"""

from __future__ import annotations

import pytorch_lightning as pl


class StopAtBlockEnd(pl.Callback):
    """Stops training after epoch `end - 1` (0-based): the block [start, end) is then complete."""

    def __init__(self, end: int) -> None:
        self.end = end

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.end:
            trainer.should_stop = True

"""How the training epochs split into blocks, each one Snakemake job (shared by the rules and train.py).
Shown by `tests/test_train.py::test_blocks_cover_every_epoch_once_and_the_last_may_be_shorter`."""

from __future__ import annotations


def block_ranges(epochs: int, per_block: int) -> list[tuple[int, int]]:
    """[(first_epoch, end_epoch), ...] with 0-based epochs and exclusive ends; the last block may be shorter."""
    if epochs < 1 or per_block < 1:
        raise ValueError("epochs and epochs_per_block must be positive")
    return [(start, min(start + per_block, epochs)) for start in range(0, epochs, per_block)]


def block_name(index: int) -> str:
    """Folder name of block `index` (1-based): block_01, block_02, ..."""
    return f"block_{index:02d}"

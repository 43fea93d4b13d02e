"""How a run's epochs split into blocks, each one Snakemake job: the rules and the train stage share this."""

from __future__ import annotations

from rfdetr_coco_pipeline.settings import Settings


def block_ranges(epochs: int, per_block: int) -> list[tuple[int, int]]:
    """[(first_epoch, end_epoch), ...] with 0-based epochs and exclusive ends; the last block may be shorter."""
    if epochs < 1 or per_block < 1:
        raise ValueError("epochs and epochs_per_block must be positive")
    return [(start, min(start + per_block, epochs)) for start in range(0, epochs, per_block)]


def block_name(index: int) -> str:
    """Folder name of block `index` (1-based): block_01, block_02, ..."""
    return f"block_{index:02d}"


def run_blocks(settings: Settings) -> dict[str, tuple[int, int]]:
    """Every block of the run by name, in order, with its epoch range."""
    ranges = block_ranges(settings.recipe.epochs, settings.train.epochs_per_block)
    return {block_name(index): epochs for index, epochs in enumerate(ranges, start=1)}


def block_range(settings: Settings, name: str) -> tuple[int, int]:
    """The epoch range [first, end) of the block `name`."""
    return run_blocks(settings)[name]

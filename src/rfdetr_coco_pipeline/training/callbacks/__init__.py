"""The workflow's Lightning callbacks, and how they reach the Trainer that rfdetr's `train()` builds.

rfdetr's `train()` takes no callbacks. Lightning, though, adds to every Trainer the callbacks that the factories
registered under the entry point group `pytorch_lightning.callbacks_factory` return (Lightning's documented
extension point); this package registers `active_callbacks` there (pyproject.toml). It returns the callbacks of the
`attached` block in progress, and nothing outside one, so no other Trainer in the process is touched.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rfdetr_coco_pipeline.common import StageError

ENTRY_POINT_GROUP = "pytorch_lightning.callbacks_factory"
_active: list[Any] = []


def active_callbacks() -> list[Any]:
    """The callbacks for a Trainer built now: those of the `attached` block in progress."""
    return list(_active)


def check_registered() -> None:
    """StageError unless this installation registers `active_callbacks` with Lightning: without it a block would
    train past its end and write no epoch log."""
    entries = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    if not any(entry.value == f"{__name__}:active_callbacks" for entry in entries):
        raise StageError(
            "The workflow's Lightning callbacks are not registered in this Python (the entry point "
            f"{ENTRY_POINT_GROUP}). Install the workflow with pip install -e . in its folder, then run snakemake again."
        )


@contextmanager
def attached(callbacks: Sequence[Any]) -> Iterator[None]:
    """Within this block, every Trainer Lightning builds gets `callbacks`."""
    check_registered()
    _active[:] = callbacks
    try:
        yield
    finally:
        _active.clear()

"""Add Lightning callbacks (and plugins) to the Trainer that rfdetr's `train()` builds.

rfdetr 1.11.2's `train()` takes no callbacks argument; it imports the public `rfdetr.training.build_trainer` at call
time, so wrapping that function inside a `with` block is enough. Every training of the workflow uses this hook, with
or without speedups (the block end and the epoch log are callbacks). A release without that function stops with
what to do. Shown by `tests/test_rfdetr_extensions.py::test_the_trainer_hook_adds_callbacks_inside_the_block_only`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_extensions import CHECKED_RFDETR, SpeedupError
from rfdetr_extensions.patching import patch_rfdetr


def with_callbacks(callbacks: Sequence[Any], plugins: Sequence[Any]) -> Callable[[Callable[..., Any]], Any]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def build_trainer(*args: Any, **kwargs: Any) -> Any:
            trainer = original(*args, **kwargs, **({"plugins": list(plugins)} if plugins else {}))
            trainer.callbacks.extend(callbacks)
            return trainer

        return build_trainer

    return wrap


def extra_callbacks(callbacks: Sequence[Any], plugins: Sequence[Any] = ()) -> AbstractContextManager[None]:
    """Within this block, every Trainer rfdetr builds also has `callbacks` (and, when given, `plugins`)."""
    import rfdetr.training

    if not callable(getattr(rfdetr.training, "build_trainer", None)):
        raise SpeedupError(
            "This rfdetr has no rfdetr.training.build_trainer, through which the workflow adds its callbacks "
            f"(block end, epoch log). Install rfdetr=={CHECKED_RFDETR} (pip install -e . does)."
        )
    return patch_rfdetr("rfdetr.training", "build_trainer", with_callbacks(callbacks, plugins))

"""Add Lightning plugins to the Trainer that rfdetr's `train()` builds.

rfdetr's `train()` takes no plugins; it looks up `rfdetr.training.build_trainer` when it is called, so wrapping that
function inside a `with` block reaches its Trainer. The workflow adds its durable checkpoint writer there, and
Lightning's `LightningEnvironment` when one job trains on several GPUs of its node
(`training.rfdetr_call.trainer_plugins_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def with_plugins(plugins: Sequence[Any]) -> Callable[[Callable[..., Any]], Any]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def build_trainer(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **{**kwargs, "plugins": [*kwargs.get("plugins", []), *plugins]})

        return build_trainer

    return wrap


def trainer_plugins(plugins: Sequence[Any]) -> AbstractContextManager[None]:
    """Within this block, every Trainer rfdetr builds also has `plugins` (nothing is replaced when there are none)."""
    if not plugins:
        return nullcontext()
    return patch_rfdetr("rfdetr.training", "build_trainer", with_plugins(plugins))

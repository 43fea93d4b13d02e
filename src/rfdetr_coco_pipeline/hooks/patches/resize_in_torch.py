"""Training images are resized by torch's uint8 kernel instead of Pillow's: the data loader's costliest step.

rfdetr's training pipeline resizes (and, with scale jitter, crops) the decoded Pillow image, flips it, and only
then turns it into a tensor (`ToImage`). Here the same pipeline starts with rfdetr's own `ToImage`, so every later
step gets a channels-last uint8 tensor and torchvision runs its tensor kernels: the same resize (bilinear,
antialiased), crop and flip, the same random draws, the same boxes. The later `ToImage` passes the tensor through.

Not rfdetr's values: torch's antialiased uint8 resize rounds differently from Pillow's, so pixels differ by up to
2 levels of 255. The registry therefore applies it only where `train.speedups` names it, never under `auto` or
`all`. Only the torchvision pipeline of the training set changes (Albumentations pipelines and the validation set
keep rfdetr's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def tensor_first(compose: Any) -> None:
    """Put a `ToImage` at the start of a pipeline (rfdetr's `Compose`) that converts to a tensor later, and not
    first; any other pipeline is left as it is."""
    from torchvision.transforms.v2 import ToImage

    steps = getattr(compose, "transforms", None)
    if (
        isinstance(steps, list)
        and steps
        and not isinstance(steps[0], ToImage)
        and any(isinstance(step, ToImage) for step in steps)
    ):
        compose.transforms = [ToImage(), *steps]


def _route_train_as_tensors(route: Callable[..., Any]) -> Callable[..., Any]:
    def route_transforms(image_set: str, *args: Any, **kwargs: Any) -> Any:
        compose = route(image_set, *args, **kwargs)
        if image_set == "train":
            tensor_first(compose)
        return compose

    return route_transforms


@contextmanager
def resize_in_torch() -> Iterator[None]:
    """Within this block, rfdetr's training pipelines work on uint8 tensors from their first step."""
    with patch_rfdetr("rfdetr.datasets.coco", "_route_transforms", _route_train_as_tensors):
        yield

"""Images travel from the loader workers to the GPU as bytes; the GPU makes rfdetr's normalised floats.

rfdetr's training and validation transforms end by converting each image to float32
(`ToDtype(float32, scale=True)`) and normalising it (`Normalize`), in the loader worker. A batch of 128 images at
384 px is then 226 MB of float32 in shared memory, which the training process pins and then frees, holding Python's
interpreter lock (`python -m bench.shared_memory_free` measures how long that takes).

This replaces rfdetr's private `rfdetr.datasets.coco._route_transforms` so that the pipelines of the chosen image sets
drop those two steps, keeping `Normalize`'s target part (boxes to relative cxcywh): a batch is 57 MB of uint8. It
wraps `RFDETRDataModule.on_after_batch_transfer` so that, once the batch is on the GPU, the same two operations run
there on the whole batch (torchvision's `to_dtype_image`, then the subtraction and division `Normalize` does, with
mean and std sent to the GPU once). Two registry entries use it: `images_as_bytes` for the training set and
`validation_images_as_bytes` for the validation set; applied together they share one conversion on the GPU.
Guarantees: the floats are rfdetr's bit for bit, and padding, which rfdetr adds after normalising, is zero again;
the batch keeps rfdetr's `no_padding` flag (with it rfdetr's model uses constant padding masks and, in validation,
cached position encodings); the other image sets keep rfdetr's pipeline; pipelines that do not end in `ToDtype` +
`Normalize` (rfdetr's Kornia GPU augmentation) are left as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, send_without_waiting

WHAT = __name__


def _image_unchanged(image: Any) -> Any:
    return image  # a module-level function, so the transform pickles into spawned loader workers


class RelativeTargets:
    """rfdetr's `Normalize` without its image step: boxes and keypoints become relative, the image stays uint8."""

    def __init__(self, normalize: Any) -> None:
        self.mean = tuple(normalize._normalize.mean)
        self.std = tuple(normalize._normalize.std)
        self.targets_only = copy.copy(normalize)
        self.targets_only._normalize = _image_unchanged

    def __call__(self, image: Any, target: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any] | None]:
        return self.targets_only(image, target)


def bytes_pipeline(compose: Any) -> RelativeTargets | None:
    """Turn a pipeline ending in `ToDtype(float32, scale=True), Normalize` into one that ends with the
    uint8 image and relative targets; returns the replacement step, or None when the pipeline ends otherwise."""
    import torch
    from rfdetr.datasets.transforms import Normalize
    from torchvision.transforms.v2 import ToDtype

    if len(compose.transforms) < 2:
        return None
    *rest, to_float, normalize = compose.transforms
    if not (
        isinstance(to_float, ToDtype)
        and to_float.dtype == torch.float32
        and to_float.scale
        and type(normalize) is Normalize
    ):
        return None
    relative_targets = RelativeTargets(normalize)
    compose.transforms = [*rest, relative_targets]
    return relative_targets


def normalize_in_torch(images: Any, padding: Any, mean: Any, std: Any) -> Any:
    """rfdetr's floats of (N, C, H, W) uint8 `images`: the same operations, in the same order, as its `ToDtype` and
    torchvision's `normalize` with (C, 1, 1) float32 `mean` and `std`; zero where (N, H, W) `padding` is set."""
    import torch
    from torchvision.transforms.v2.functional import to_dtype_image

    floats = to_dtype_image(images, torch.float32, scale=True).sub_(mean).div_(std)
    if padding is not None:
        # rfdetr pads after normalising, with zeros: padding converted from zero bytes is not zero.
        floats.masked_fill_(padding.unsqueeze(1), 0.0)
    return floats


class DeviceNormalize:
    """rfdetr's float conversion and normalisation, on a batch already on its device, without host waits.
    `convert` makes the floats: `normalize_in_torch`, or a function that gives its values bit for bit."""

    def __init__(self) -> None:
        self.mean_std: tuple[tuple[float, ...], tuple[float, ...]] | None = None
        self.on_device: dict[Any, tuple[Any, Any]] = {}
        self.convert: Callable[[Any, Any, Any, Any], Any] = normalize_in_torch

    def remember(self, step: RelativeTargets) -> None:
        found = (step.mean, step.std)
        if self.mean_std not in (None, found):
            raise RuntimeError(f"{WHAT}: two pipelines normalise differently ({self.mean_std} and {found})")
        self.mean_std = found

    def __call__(self, samples: Any) -> Any:
        import torch
        from rfdetr.utilities.tensors import NestedTensor

        images = samples.tensors
        if images.dtype != torch.uint8:
            return samples
        if self.mean_std is None:
            raise RuntimeError(f"{WHAT}: a batch of uint8 images arrived, but no pipeline was changed")
        if images.device not in self.on_device:
            mean, std = (torch.tensor(values, dtype=torch.float32).view(-1, 1, 1) for values in self.mean_std)
            self.on_device[images.device] = (
                send_without_waiting(mean, images.device),
                send_without_waiting(std, images.device),
            )
        mean, std = self.on_device[images.device]
        floats = self.convert(images, samples.mask, mean, std)
        # rfdetr's claim that no image is padded travels on: its model then skips the padding mask's work
        return NestedTensor(floats, samples.mask, samples.no_padding)


HOOK = "rfdetr.training.module_data:RFDETRDataModule"


@contextmanager
def images_of_sets_as_bytes(image_sets: Collection[str]) -> Iterator[DeviceNormalize]:
    """Within this block, rfdetr's batches of `image_sets` ("train", "val") are uint8 until they reach the GPU.

    Where another such block already wraps the after-transfer hook, this one adds its pipelines to that block's
    conversion instead of wrapping the hook twice."""
    import pkgutil

    existing = getattr(pkgutil.resolve_name(HOOK).on_after_batch_transfer, "device_normalize", None)
    shared = isinstance(existing, DeviceNormalize)
    device_normalize = existing if shared else DeviceNormalize()

    def route_sets_as_bytes(route: Callable[..., Any]) -> Callable[..., Any]:
        def route_transforms(image_set: str, *args: Any, **kwargs: Any) -> Any:
            compose = route(image_set, *args, **kwargs)
            if image_set in image_sets and (step := bytes_pipeline(compose)) is not None:
                device_normalize.remember(step)
            return compose

        return route_transforms

    def normalize_first(hook: Callable[..., Any]) -> Callable[..., Any]:
        def on_after_batch_transfer(self: Any, batch: tuple[Any, Any], dataloader_idx: int) -> tuple[Any, Any]:
            samples, targets = batch
            return hook(self, (device_normalize(samples), targets), dataloader_idx)

        on_after_batch_transfer.device_normalize = device_normalize  # type: ignore[attr-defined]
        return on_after_batch_transfer

    with ExitStack() as patches:
        patches.enter_context(patch_rfdetr("rfdetr.datasets.coco", "_route_transforms", route_sets_as_bytes))
        if not shared:
            patches.enter_context(patch_rfdetr(HOOK, "on_after_batch_transfer", normalize_first))
        yield device_normalize


def images_as_bytes() -> AbstractContextManager[DeviceNormalize]:
    """Within this block, rfdetr's training batches are uint8 until they reach the GPU (see the module's text)."""
    return images_of_sets_as_bytes(("train",))

"""Decode and resize each validation image once per run, not once per validation.

rfdetr 1.11.2's validation loader reads every val2017 image from disk, decodes the JPEG and applies the validation
transform (a square resize and the normalisation) at every validation, although the validation transform has no
randomness: every epoch computes the same tensors again. For COCO's 5,000 images that is all the loader's 16
workers' time for about 3 s per validation on the H200's host, competing with the training loader's workers
(`next_epoch_during_validation`).

This wraps `RFDETRDataModule.val_dataloader`: before rfdetr builds the loader, its validation dataset (a plain
`rfdetr.datasets.coco.CocoDetection`) becomes a `KeptCocoDetection`, which keeps each sample the first time it
computes it and hands out a copy afterwards. The loader's workers are persistent and a sequential sampler gives each
worker the same batches every epoch, so each worker keeps the samples it makes. Memory: about 1.8 MB per image at
384 px (float32), about 9 GB of RAM for val2017 across the workers. Other dataset types keep rfdetr's loader.

Guarantees: every validation batch is the one rfdetr builds (samples computed by rfdetr's own `__getitem__`,
handed out as copies so nothing downstream can change the kept ones). Shown by
`tests/test_validation_metrics.py::test_kept_validation_samples_equal_rfdetrs_at_every_epoch`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr.datasets.coco import CocoDetection

from rfdetr_extensions.patching import patch_rfdetr


class KeptCocoDetection(CocoDetection):
    """rfdetr's CocoDetection that computes each sample once and then returns copies of it."""

    def __getitem__(self, idx: int) -> tuple[Any, Any]:
        kept = self.__dict__.setdefault("_kept_samples", {})
        if idx not in kept:
            kept[idx] = super().__getitem__(idx)
        return copy.deepcopy(kept[idx])


def keeping_validation_samples(original: Callable[..., Any]) -> Callable[..., Any]:
    def val_dataloader(datamodule: Any) -> Any:
        if type(datamodule._dataset_val) is CocoDetection:
            datamodule._dataset_val.__class__ = KeptCocoDetection
        return original(datamodule)

    return val_dataloader


def validation_images_kept() -> AbstractContextManager[None]:
    """Within this block, rfdetr's validation loader computes each sample once (see module doc)."""
    return patch_rfdetr("rfdetr.training.module_data:RFDETRDataModule", "val_dataloader", keeping_validation_samples)

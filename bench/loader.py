"""How many images per second rfdetr's own data loader delivers (training, or a validation pass), with no model.

usage: python -m bench.loader --dataset DIR [--batch 128] [--workers 16] [--waves 3] [--prefetch 2] [--images-as-bytes]
           [--tensor-resize]
       python -m bench.loader --dataset DIR --one-process [--images-as-bytes] [--tensor-resize]   (ms per image, no
           workers)
       python -m bench.loader --dataset DIR --split val [--batch 125] [--workers 16] [--images-as-bytes]
           (a whole pass over the validation set from a fresh loader, as a validation without
           validation_loader_ahead starts it: the least time the loader lets a validation take)

Builds the training DataLoader exactly as rfdetr 1.11.2's `train()` does for the workflow's recipe (COCO layout,
384 px, square resize, no multi-scale) and times whole batches after a warm-up, pinned memory included. If this
rate is far above the training rate, the loader is not what holds training back.

`--tensor-resize` builds the training set inside the `resize_in_torch` speedup (the registry's, applied only where
train.speedups names it): each training image enters rfdetr's transforms as a uint8 tensor, so torchvision resizes
it with torch's uint8 kernel instead of Pillow's. The boxes stay rfdetr's; the pixels differ by up to 2 levels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.hooks.patches.images_as_bytes import images_as_bytes
from rfdetr_coco_pipeline.hooks.patches.resize_in_torch import resize_in_torch
from rfdetr_coco_pipeline.hooks.patches.validation_images_as_bytes import validation_images_as_bytes


def recipe_data(
    dataset: str,
    batch: int,
    workers: int,
    prefetch: int | None = None,
    resolution: int = 384,
    eval_batch: int | None = None,
) -> Any:
    """rfdetr's data module for the workflow's recipe, set up for training (and its validation)."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_data import RFDETRDataModule

    model_config = RFDETRNanoConfig(pretrain_weights=None, resolution=resolution)
    train_config = TrainConfig(
        dataset_file="coco",
        dataset_dir=dataset,
        output_dir="/tmp/bench-loader",
        batch_size=batch,
        num_workers=workers,
        prefetch_factor=prefetch,
        multi_scale=False,
        square_resize_div_64=True,
        tensorboard=False,
        eval_batch_size=eval_batch,
    )
    data = RFDETRDataModule(model_config, train_config)
    data.setup("fit")
    return data


def training_data(dataset: str, batch: int, workers: int, tensor_resize: bool = False, **options: Any) -> Any:
    """`recipe_data`, its training set built inside `resize_in_torch` when `tensor_resize`."""
    with resize_in_torch() if tensor_resize else contextlib.nullcontext():
        return recipe_data(dataset, batch, workers, **options)


def milliseconds_per_image(dataset: str, images: int = 200, tensor_resize: bool = False) -> dict[str, float]:
    """One process, no workers: the milliseconds one training image takes to read, decode and augment."""
    data = training_data(dataset, 1, 0, tensor_resize)
    samples = data.train_dataloader().dataset
    for index in range(10):  # warm-up: imports, first allocations
        samples[index]
    started = time.perf_counter()
    for index in range(10, 10 + images):
        samples[index]
    return {"images": images, "ms_per_image": round((time.perf_counter() - started) / images * 1000, 2)}


def loader_images_per_second(
    dataset: str,
    batch: int,
    workers: int,
    waves: int = 3,
    prefetch: int | None = None,
    resolution: int = 384,
    tensor_resize: bool = False,
) -> dict[str, float]:
    """Images/s of rfdetr's training DataLoader once all its workers are busy (the set must hold
    `workers * (waves + 1)` batches)."""
    data = training_data(dataset, batch, workers, tensor_resize, prefetch=prefetch, resolution=resolution)
    # Every worker builds whole batches, so batches arrive in waves of `workers`: time from the end of the first
    # wave, when every worker is busy, over whole further waves.
    batches_seen, images, started = 0, 0, 0.0
    for samples, _targets in data.train_dataloader():
        batches_seen += 1
        if batches_seen == workers:
            started = time.perf_counter()
        elif batches_seen > workers:
            images += samples.tensors.shape[0]
        if batches_seen == workers * (waves + 1):
            break
    seconds = time.perf_counter() - started
    return {
        "workers": workers,
        "batch": batch,
        "images": images,
        "seconds": round(seconds, 2),
        "images_per_second": round(images / seconds, 1),
    }


def validation_pass(dataset: str, batch: int, workers: int, prefetch: int | None = None) -> dict[str, float]:
    """Seconds for rfdetr's validation DataLoader to deliver every batch of the validation set, from a fresh
    iterator (its workers start with it), and the images/s that makes."""
    data = recipe_data(dataset, 128, workers, prefetch, eval_batch=batch)
    started = time.perf_counter()
    first, images, dtypes = 0.0, 0, set()
    for samples, _targets in data.val_dataloader():
        first = first or time.perf_counter() - started
        images += samples.tensors.shape[0]
        dtypes.add(str(samples.tensors.dtype))
    seconds = time.perf_counter() - started
    return {
        "split": "val",
        "workers": workers,
        "batch": batch,
        "images": images,
        "image_dtype": ", ".join(sorted(dtypes)),
        "first_batch_seconds": round(first, 3),
        "seconds": round(seconds, 3),
        "images_per_second": round(images / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--batch", type=int, help="default: 128 (train), 125 (val: the train stage's validation batch)")
    parser.add_argument("--split", choices=("train", "val"), default="train")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--waves", type=int, default=3, help="batches measured: workers x waves")
    parser.add_argument("--prefetch", type=int)
    parser.add_argument(
        "--images-as-bytes", action="store_true", help="as the train stage: the images_as_bytes speedup"
    )
    parser.add_argument("--one-process", action="store_true", help="milliseconds per image, without workers")
    parser.add_argument(
        "--tensor-resize", action="store_true", help="training images resized as uint8 tensors (a candidate, above)"
    )
    args = parser.parse_args()
    as_bytes = validation_images_as_bytes if args.split == "val" else images_as_bytes
    # rfdetr's and pycocotools' messages go to stderr, so that stdout is the JSON result alone
    with contextlib.redirect_stdout(sys.stderr), as_bytes() if args.images_as_bytes else contextlib.nullcontext():
        if args.split == "val":
            result = validation_pass(args.dataset, args.batch or 125, args.workers, args.prefetch)
        elif args.one_process:
            result = milliseconds_per_image(args.dataset, tensor_resize=args.tensor_resize)
        else:
            batch = args.batch or 128
            result = loader_images_per_second(
                args.dataset, batch, args.workers, args.waves, args.prefetch, tensor_resize=args.tensor_resize
            )
    cpus = len(os.sched_getaffinity(0))
    print(
        json.dumps(
            {**result, "images_as_bytes": args.images_as_bytes, "tensor_resize": args.tensor_resize, "cpus": cpus}
        )
    )


if __name__ == "__main__":
    run_stage(main)

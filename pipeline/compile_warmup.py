"""The compile warm-up: torch.compile's graphs of the training step, compiled while train2017 downloads.

A training job on a cold compile cache spends its first minutes compiling: the first epoch of a compiled route
carries the compile of the training step's graphs (BENCHMARKS.md, "The start and end of a training job"). torch
keeps what it compiles in the run's compile cache (`pipeline.rfdetr_call.configure_compile_cache`) and finds it
there by the graph and the shapes, dtypes and strides of its inputs, never by the data. So a short training of the
same route on other images of the same shapes compiles what the first training job will look up: the model's graphs
exactly, and the variants of rfdetr's matcher cost (`pairwise_box_l1_cost`, specialised on its inputs' storage
offsets) that the warm-up's images reach; the first job compiles any other variant it meets, a small graph.

The compile_warmup rule runs that training once val2017 is extracted, beside the long train2017 download: the run's
recipe, GPU profile and speedups (`pipeline.rfdetr_call.training_route`, as the train stage picks them), one epoch of
the reference recipe on `warmup_images` images of val2017, validated at the run's own validation batch.

Guarantees: the run itself is untouched. The warm-up writes only into the compile cache and its report, and torch
uses a cache entry only for a graph that matches it, so a warm-up that compiled something else costs the first block
nothing but the compile it would have done anyway. A route that compiles nothing (the CPU, the FP8 route) or several
GPUs (DDP compiles one graph per gradient bucket) is not warmed up, with the reason in the report. Shown by
`tests/test_compile_warmup.py` and, on the GPU, by
`tests/test_gpu.py::test_the_h200_row_as_a_user_gets_it_captures_and_replays_cuda_graphs`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.common import StageError, log
from pipeline.dataset import count_images
from pipeline.gpu_profiles import batch_multiple
from pipeline.rfdetr_call import TrainingRoute, eval_batch_size, run_rfdetr, train_kwargs

SOURCE_SPLIT = "val2017"  # extracted before train2017 is downloaded (config.yaml: archives, in order)


def skip_reason(route: TrainingRoute, gpus: int) -> str | None:
    """Why the warm-up would compile nothing training could use on this route; None when it applies."""
    if route.device.kind != "cuda":
        return "training runs on the CPU, where rfdetr does not compile"
    if not route.profile["compile"]:
        return f"the GPU profile {route.profile['name']!r} does not compile (compile: false)"
    if gpus > 1:
        return "training runs on several GPUs: DDP compiles one graph per gradient bucket, the warm-up one GPU's"
    return None


def warmup_images(dataset: Path, recipe: dict) -> int:
    """The images the warm-up trains and validates on: the run's validation batch, computed from the real val2017
    exactly as the train stage computes it. A validation set of that size has that batch too, so a compiled
    validation meets the graph training will use (`pipeline.rfdetr_call.eval_batch_size` maps its result to itself)."""
    multiple = batch_multiple(recipe, recipe["resolution"])
    return eval_batch_size(count_images(dataset / SOURCE_SPLIT), recipe["batch_size"], recipe["gpus"], multiple)


def write_warmup_dataset(source: Path, target: Path, images: int) -> int:
    """A COCO2017-layout dataset at `target` of `images` val2017 images of `source` (links, not copies), used as
    both its train2017 and its val2017, with all of val2017's categories, so rfdetr sizes the class head as for the
    real set. Images with boxes come first. Returns the image count."""
    annotation_file = source / "annotations" / f"instances_{SOURCE_SPLIT}.json"
    try:
        coco = json.loads(annotation_file.read_text())
    except (OSError, ValueError) as error:
        raise StageError(f"Cannot read {annotation_file} for the compile warm-up: {error}") from error
    boxes_per_image: dict[int, list[dict]] = {}
    for annotation in coco["annotations"]:
        boxes_per_image.setdefault(annotation["image_id"], []).append(annotation)
    on_disk = [image for image in coco["images"] if (source / SOURCE_SPLIT / image["file_name"]).is_file()]
    chosen = sorted(on_disk, key=lambda image: (image["id"] not in boxes_per_image, image["id"]))[:images]
    if not chosen:
        raise StageError(f"No image of {annotation_file} is in {source / SOURCE_SPLIT}: nothing to warm up with.")
    subset = {
        "images": chosen,
        "annotations": [a for image in chosen for a in boxes_per_image.get(image["id"], [])],
        "categories": coco["categories"],
    }
    (target / "annotations").mkdir(parents=True, exist_ok=True)
    for split in ("train2017", "val2017"):
        (target / split).mkdir(exist_ok=True)
        for image in chosen:
            os.symlink((source / SOURCE_SPLIT / image["file_name"]).resolve(), target / split / image["file_name"])
        (target / "annotations" / f"instances_{split}.json").write_text(json.dumps(subset))
    return len(chosen)


def compile_by_training(
    train: Mapping[str, Any], route: TrainingRoute, recipe: Mapping[str, Any], dataset: Path, workers: int
) -> dict[str, Any]:
    """One epoch of `recipe` on `route` (rfdetr's train() as the train stage calls it, with its speedups and
    callbacks) on a warm-up set of `dataset`'s val2017 in a scratch folder: the images, seconds and torch.compile's
    cache lookups (`rfdetr_extensions.callbacks.epoch_log.compile_cache_counts`) of that epoch."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compile-warmup-") as scratch:
        warmup_set, state = Path(scratch) / "coco2017", Path(scratch) / "state"
        images = write_warmup_dataset(dataset, warmup_set, warmup_images(dataset, dict(recipe)))
        log.info("Compile warm-up: one epoch of %d val2017 images, GPU profile %s", images, route.profile["name"])
        kwargs = train_kwargs(recipe, str(warmup_set), state, workers, route.device, loggers=("csv",))
        run_rfdetr(recipe, route, kwargs, 1, train)
        (epoch,) = [json.loads(line) for line in (state / "epochs.jsonl").read_text().splitlines()]
    seconds = round(time.perf_counter() - started, 1)
    log.info("Compile warm-up: %.1f s; compile cache lookups: %s", seconds, json.dumps(epoch["compile_cache"]))
    return {"images": images, "seconds": seconds, "compile_cache": epoch["compile_cache"]}

"""The compile warm-up: torch.compile's graphs of the training step, compiled while train2017 downloads.

A training job on a cold compile cache spends its first minutes compiling the training step's graphs. torch keeps
what it compiles in the run's compile cache (`rfdetr_call.configure_compile_cache`) and finds it there by the graph
and the shapes, dtypes and strides of its inputs, never by the data. So a short training of the same route on other
images of the same shapes compiles what the first training job will look up: the model's graphs exactly, and the
variants of rfdetr's matcher cost that the warm-up's images reach; the first job compiles any other variant it
meets, a small graph.

The compile_warmup rule runs that training once val2017 is extracted, beside the long train2017 download: the run's
recipe and route (`route.settle_route`, as the train stage settles it), one epoch of the recipe on as many val2017
images as the run's validation batch, validated at that batch.

Guarantees: the run itself is untouched. The warm-up writes only into the compile cache and its report, and torch
uses a cache entry only for a graph that matches it, so a warm-up that compiled something else costs the first block
nothing but the compile it would have done anyway. A route that compiles nothing (the CPU, the FP8 route) or several
GPUs (DDP compiles one graph per gradient bucket) is not warmed up, with the reason in the report. A failure is
reported, not raised: the first training job then compiles as it would have, and reports any real problem itself.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rfdetr_coco_pipeline.common import StageError, log
from rfdetr_coco_pipeline.data.dataset import count_images
from rfdetr_coco_pipeline.hooks import check_hooks
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.recipe import nodes_of, run_recipe
from rfdetr_coco_pipeline.training.rfdetr_call import configure_compile_cache, eval_batch_size, run_rfdetr, train_kwargs
from rfdetr_coco_pipeline.training.route import Route, settle_route

SOURCE_SPLIT = "val2017"  # extracted before train2017 is downloaded (config.yaml: archives, in order)


def skip_reason(route: Route, gpus: int) -> str | None:
    """Why the warm-up would compile nothing training could use on this route; None when it applies."""
    if route.device.kind != "cuda":
        return "training runs on the CPU, where rfdetr does not compile"
    if not route.profile.compile:
        return f"the GPU profile {route.profile.name!r} does not compile (compile: false)"
    if gpus > 1:
        return "training runs on several GPUs: DDP compiles one graph per gradient bucket, the warm-up one GPU's"
    return None


def warmup_images(dataset: Path, recipe: dict[str, Any], route: Route) -> int:
    """The images the warm-up trains and validates on: the run's validation batch, computed from the real val2017
    as the train stage computes it. A validation set of that size has that batch too (`eval_batch_size` maps its
    result to itself), so a compiled validation meets the graph training will use."""
    images = count_images(dataset / SOURCE_SPLIT)
    return eval_batch_size(images, recipe["batch_size"], recipe["gpus"] * nodes_of(recipe), route.batch_multiple)


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


def compile_by_training(settings: Settings, route: Route, recipe: dict[str, Any], dataset: Path, workers: int) -> dict:
    """One epoch of `recipe` on `route` (rfdetr's train() as the train stage calls it, with its speedups and
    callbacks) on a warm-up set of `dataset`'s val2017 in a scratch folder: the images, seconds and torch.compile's
    cache lookups of that epoch."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compile-warmup-") as scratch:
        warmup_set, state = Path(scratch) / "coco2017", Path(scratch) / "state"
        images = write_warmup_dataset(dataset, warmup_set, warmup_images(dataset, recipe, route))
        log.info("Compile warm-up: one epoch of %d val2017 images, GPU profile %s", images, route.profile.name)
        kwargs = train_kwargs(recipe, route, warmup_set, state, workers)
        run_rfdetr(settings, route, kwargs, 1)
        (epoch,) = [json.loads(line) for line in (state / "epochs.jsonl").read_text().splitlines()]
    seconds = round(time.perf_counter() - started, 1)
    log.info("Compile warm-up: %.1f s; compile cache lookups: %s", seconds, json.dumps(epoch["compile_cache"]))
    return {"images": images, "seconds": seconds, "compile_cache": epoch["compile_cache"]}


def warm_up(settings: Settings, dataset: Path, workers: int, rfdetr_version: str) -> dict[str, Any]:
    """The warm-up on the route the train stage will take here, and its report: whether it compiled (or why not),
    the GPU profile and speedups, and the warm-up's images, seconds and compile cache lookups."""
    try:
        configure_compile_cache(settings.paths.state)  # the cache the train stage reads
        check_hooks()
        route = settle_route(settings, rfdetr_version)
        report: dict[str, Any] = {"profile": route.profile.name, "speedups": route.speedups.names()}
        if reason := skip_reason(route, settings.recipe.ranks):
            log.info("Compile warm-up: nothing to compile (%s)", reason)
            return {"compiled": False, "reason": reason, **report}
        recipe = run_recipe(settings.recipe, route.profile, rfdetr_version)
        return {"compiled": True, **compile_by_training(settings, route, recipe, dataset, workers), **report}
    except Exception as error:  # the warm-up only saves time; the first training job reports real problems
        log.exception("Compile warm-up failed; the first training job will compile instead")
        return {"compiled": False, "reason": f"failed: {type(error).__name__}: {error}"}

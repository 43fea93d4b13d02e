"""Run the validation's F1 matching in worker processes while the training process goes on to the next batch.

rfdetr's `COCOEvalCallback` matches every validation batch's detections to its ground truth for the F1
sweep (`rfdetr.evaluation.matching.build_matching_data`: per image and class, a greedy match in Python) inside
`on_validation_batch_end`, on the training process's one thread, while the GPU and the loader wait for it: a large
part of a validation's time.

Within this block the callback's module-level `build_matching_data` hands the batch to a pool of worker processes
(`WORKERS`, started from a fork server, so they hold no CUDA state) and returns at once; `merge_matching_data`
keeps the pending result in the accumulator's order; `_compute_and_log_f1_metrics`, the one reader of the
accumulator, first merges every pending batch in the order the batches came, then runs rfdetr's sweep. The workers
run rfdetr's own `build_matching_data` on host tensors (`metric_inputs_in_one_copy` brings them there; device
tensors are copied here). Segmentation matching and accumulators created outside this block keep rfdetr's path.

The fork server starts when the block is entered, without waiting: importing rfdetr there takes seconds, and
started at the first validation batch it would hold up each job's first validation, behind the loader workers busy
on the same cores. Started at the block's entry, that import runs while the model is built and trains.

Guarantees: the accumulator, and so `val/F1`, precision and recall, equal rfdetr's, array for array. The pool is
shut down when the block ends.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

CALLBACK_MODULE = "rfdetr.training.callbacks.coco_eval"
# processes: a few, as they share the cores with the loader's workers (one on a machine of up to 7 cores)
WORKERS = min(4, max(1, len(os.sched_getaffinity(0)) // 4))


class PendingAccumulator(dict):
    """rfdetr's matching accumulator (class id -> arrays) plus the batches still being matched, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Future] = []


def match_on_host(batch: tuple[list[dict[str, Any]], list[dict[str, Any]]], iou_threshold: float) -> Any:
    """rfdetr's build_matching_data, in a worker process."""
    from rfdetr.evaluation.matching import build_matching_data

    preds, targets = batch
    return build_matching_data(preds, targets, iou_threshold=iou_threshold, iou_type="bbox")


def host_copies(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tensors a worker needs, on the host (already there after metric_inputs_in_one_copy)."""
    from rfdetr_coco_pipeline.hooks.patches.metric_inputs_in_one_copy import to_host_in_one_copy

    keys = ("boxes", "scores", "labels", "iscrowd")
    return to_host_in_one_copy([{key: item[key] for key in keys if key in item} for item in items])


class MatchingPool:
    """The worker processes of one `with` block, forked from the fork server at the first batch."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self.executor: ProcessPoolExecutor | None = None
        self.context = multiprocessing.get_context("forkserver")

    def start_fork_server(self) -> None:
        """Start the fork server now, without waiting for it: it imports rfdetr's matching once, in the background,
        and each worker later forks from it with the import done. A server already running is kept as it is."""
        from multiprocessing import forkserver

        self.context.set_forkserver_preload(["rfdetr.evaluation.matching"])
        forkserver.ensure_running()

    def submit(self, preds: list[dict[str, Any]], targets: list[dict[str, Any]], iou_threshold: float) -> Future:
        if self.executor is None:
            self.start_fork_server()  # already running when the block started it
            self.executor = ProcessPoolExecutor(self.workers, mp_context=self.context)
        return self.executor.submit(match_on_host, (host_copies(preds), host_copies(targets)), iou_threshold)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


def settle(accumulator: Any, merge: Callable[..., Any]) -> None:
    """Merge the accumulator's pending batches into it, in the order they came."""
    pending = getattr(accumulator, "pending", None)
    while pending:
        merge(accumulator, pending.pop(0).result())


@contextmanager
def matching_in_workers() -> Any:
    """Within this block, rfdetr's validation matching runs in worker processes (see module doc)."""
    import importlib

    module = importlib.import_module(CALLBACK_MODULE)
    merge_in_process = module.merge_matching_data
    pool = MatchingPool()
    pool.start_fork_server()

    def wrap_build(original: Callable[..., Any]) -> Callable[..., Any]:
        def build_matching_data(preds: Any, targets: Any, iou_threshold: float = 0.5, iou_type: str = "bbox") -> Any:
            if iou_type != "bbox":
                return original(preds, targets, iou_threshold=iou_threshold, iou_type=iou_type)
            return pool.submit(preds, targets, iou_threshold)

        return build_matching_data

    def wrap_merge(original: Callable[..., Any]) -> Callable[..., Any]:
        def merge_matching_data(accumulator: Any, new_data: Any) -> Any:
            if not isinstance(new_data, Future):
                settle(accumulator, original)  # keep the batches' order
                return original(accumulator, new_data)
            if isinstance(accumulator, PendingAccumulator):
                accumulator.pending.append(new_data)
                return accumulator
            return original(accumulator, new_data.result())  # an accumulator made before this block

        return merge_matching_data

    def wrap_compute(original: Callable[..., Any]) -> Callable[..., Any]:
        def compute_and_log_f1_metrics(callback: Any, trainer: Any, module: Any, split: str, f1_local: Any) -> Any:
            settle(f1_local, merge_in_process)
            return original(callback, trainer, module, split, f1_local)

        return compute_and_log_f1_metrics

    try:
        with (
            patch_rfdetr(CALLBACK_MODULE, "init_matching_accumulator", lambda original: PendingAccumulator),
            patch_rfdetr(CALLBACK_MODULE, "build_matching_data", wrap_build),
            patch_rfdetr(CALLBACK_MODULE, "merge_matching_data", wrap_merge),
            patch_rfdetr(f"{CALLBACK_MODULE}:COCOEvalCallback", "_compute_and_log_f1_metrics", wrap_compute),
        ):
            yield
    finally:
        pool.close()

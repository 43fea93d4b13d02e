"""Match predictions to targets without making the host wait for the GPU.

In a training step rfdetr matches all decoder layers at once (`HungarianMatcher._match_many`): it builds the
cost matrices on the GPU, then reads a safety flag on the host (`bool(...)`), solves all problems with
torch-hungarian's Triton solver, which reads two more flags (NaN costs, infeasible problems), and copies the
assignment to the host to cut it into per-image index pairs. Each read waits for all work queued on the GPU. The
loss's box count (`SetCriterion.num_boxes_for_targets`) is one more wait: a Python number copied to the GPU.

This replaces both methods with code that queues the same work and reads nothing back:

- the same cost matrices (rfdetr's own functions), the same padded batch of problems (`_assignment._stack_padded`)
  and the same Triton solver, called without its host-side checks;
- the assignment is cut into the same per-image (query, target) index pairs on the GPU, with shapes known on the
  host (every problem matches each of its image's targets exactly once);
- the box count is a tensor filled on the GPU with the same value.

Guarantees: the same indices and losses. What differs is a batch that fails rfdetr's safety gate (non-finite
predictions or targets, labels out of range): rfdetr would match it again layer by layer with sanitised costs; here
its costs are sanitised the way rfdetr does it, it is matched on the batched path, and a warning names the step once
the flag has reached the host (a later step, without waiting). Batches the batched path does not take (a single
image, masks, keypoints, layers of different sizes, more targets than a query group) go to rfdetr's own code.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, send_without_waiting

log = logging.getLogger(__name__)
WHAT = __name__
Matches = list[list[tuple[Any, Any]]]  # per layer, per image: (query indices, target indices)


def finite_costs(cost: Any) -> Any:
    """rfdetr's `HungarianMatcher._sanitize_cost_matrix` without reading anything back: non-finite entries become
    the largest finite entry plus the largest finite magnitude plus rfdetr's margin (the dtype's largest value if
    none is finite or that overflows). The same tensor values; finite costs are unchanged."""
    import torch
    from rfdetr.models.matcher import _SANITIZED_COST_MARGIN

    finite = torch.isfinite(cost)
    largest = torch.finfo(cost.dtype).max
    biggest = torch.where(finite, cost, float("-inf")).amax()
    magnitude = torch.where(finite, cost.abs(), float("-inf")).amax()
    replacement = torch.clamp(biggest + magnitude + _SANITIZED_COST_MARGIN, max=largest)
    replacement = torch.nan_to_num(replacement, nan=largest, posinf=largest, neginf=largest)
    return torch.where(finite, cost, replacement)


def matches_from_assignment(assignment: Any, sizes: list[int], group_width: int, group_detr: int) -> Matches:
    """rfdetr's `_assignment._assign_padded` unpacking, on the assignment's device, without reading it.

    `assignment` is the solver's answer for the padded problems, ordered layer, image, group: for each query of a
    group, the (padded) target column it got, or -1. Every real target of an image is matched exactly once per group,
    so how many pairs each problem keeps is known on the host, and the pairs are picked with index arithmetic instead
    of a boolean mask (whose size the host would have to read)."""
    import torch

    problems = assignment.shape[0]
    layers = problems // (len(sizes) * group_detr)
    max_size = max(sizes)
    # as rfdetr: matched queries first, in ascending query order, and the target column each got
    order = torch.argsort((assignment >= 0).to(torch.int8), dim=1, descending=True, stable=True)
    rows = order[:, :max_size]
    cols = assignment.gather(1, rows)
    # Host-built, shape-only numbers, sent in one copy: each problem's real target count and query offset, and the
    # flat positions of the pairs each problem keeps (its first `size` pairs once the real ones are put first).
    size_per_problem = torch.tensor(sizes).repeat_interleave(group_detr).repeat(layers)
    group_offset = torch.arange(problems) % group_detr * group_width
    kept = torch.arange(max_size).expand(problems, max_size) < size_per_problem.unsqueeze(1)
    positions = torch.nonzero(kept.reshape(-1)).squeeze(1)
    host = torch.cat([size_per_problem, group_offset, positions])
    size_per_problem, group_offset, positions = send_without_waiting(host, assignment.device).split(
        [problems, problems, positions.numel()]
    )
    real_first = torch.argsort((cols >= size_per_problem.unsqueeze(1)).to(torch.int8), dim=1, stable=True)
    kept_rows = (rows + group_offset.unsqueeze(1)).gather(1, real_first).reshape(-1).index_select(0, positions)
    kept_cols = cols.gather(1, real_first).reshape(-1).index_select(0, positions)
    per_image = [group_detr * size for _ in range(layers) for size in sizes]
    row_chunks, col_chunks = kept_rows.split(per_image), kept_cols.split(per_image)
    return [
        [
            (row_chunks[layer * len(sizes) + image], col_chunks[layer * len(sizes) + image])
            for image in range(len(sizes))
        ]
        for layer in range(layers)
    ]


def solve(stacked: Any) -> Any:
    """torch-hungarian's answer for a batch of problems. On a GPU its Triton solver is called without the checks
    that read flags back (NaN costs, which `finite_costs` has removed; infeasible problems, which finite costs
    with at least as many queries as targets cannot be); elsewhere its public function. These are private parts of
    torch-hungarian 0.1.0rc0, the version rfdetr's train extra pins exactly (the rfdetr check covers it)."""
    import torch_linear_assignment
    from torch_linear_assignment import assignment as public

    if stacked.is_cuda and public._cuda_uses_triton(stacked):
        from torch_linear_assignment import _triton

        return _triton.batch_linear_assignment(stacked, validation="off")
    return torch_linear_assignment.batch_linear_assignment(stacked)


class SafetyFlags:
    """rfdetr's safety flag of each matched step, read on the host once the GPU has computed it (without waiting);
    a step that failed it is named in a warning."""

    def __init__(self) -> None:
        self.pending: deque[tuple[int, Any, Any]] = deque()
        self.steps = 0  # matchings queued here
        self.declined = 0  # matchings left to rfdetr's own code
        self.failed: list[int] = []

    def record(self, safe: Any) -> None:
        import torch

        self.steps += 1
        if safe.is_cuda:
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(safe, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self.pending.append((self.steps, host, done))
        else:
            self.pending.append((self.steps, safe, None))
        self.check(wait=False)

    def check(self, wait: bool) -> None:
        while self.pending and (wait or self.pending[0][2] is None or self.pending[0][2].query()):
            step, flag, done = self.pending.popleft()
            if done is not None:
                done.synchronize()
            if not bool(flag):
                self.failed.append(step)
                log.warning(
                    "matching step %d of this process: non-finite or out-of-range predictions or targets. rfdetr "
                    "would have matched it layer by layer; it was matched on the batched path with rfdetr's "
                    "sanitised costs (%s). A diverging run shows this at every step.",
                    step,
                    WHAT,
                )


def padded_problem(
    matcher: Any, outputs_list: list[dict[str, Any]], targets: list[dict[str, Any]], group_detr: int
) -> tuple[Any, ...] | None:
    """(sizes, queries, group width) when rfdetr's `_match_many` would solve these layers as one padded batch;
    None otherwise. Reads shapes, dtypes and devices only: the routing rules of `_match_many` and
    `_assignment.assign_many_bucketed`, less the safety gate."""
    if len(outputs_list) < 2 or not all(matcher._compact_path_applicable(o, targets) for o in outputs_list):
        return None
    boxes, logits = outputs_list[0]["pred_boxes"], outputs_list[0]["pred_logits"]
    if any(
        o["pred_boxes"].dtype != boxes.dtype
        or o["pred_boxes"].device != boxes.device
        or o["pred_logits"].dtype != logits.dtype
        or o["pred_logits"].device != boxes.device
        or o["pred_logits"].shape[-1] != logits.shape[-1]
        for o in outputs_list[1:]
    ) or any(
        t["boxes"].dtype != boxes.dtype
        or t["boxes"].device != boxes.device
        or t["labels"].device != boxes.device
        or t["labels"].dtype != targets[0]["labels"].dtype
        for t in targets
    ):
        return None
    sizes = [len(t["boxes"]) for t in targets]
    queries = {o["pred_logits"].shape[1] for o in outputs_list}
    if sum(sizes) == 0 or len(queries) != 1:
        return None
    (num_queries,) = queries
    if num_queries % group_detr or max(sizes) > num_queries // group_detr:
        return None
    return sizes, num_queries, num_queries // group_detr


def match_many_without_waiting(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `HungarianMatcher._match_many`: the batches it solves as one padded batch are solved here without
    reading anything back; all others go to `original`."""
    import torch
    from rfdetr.models import _assignment
    from rfdetr.models import matcher as matcher_module

    flags = SafetyFlags()

    @torch.no_grad()
    def _match_many(
        self: Any,
        outputs_list: list[dict[str, Any]],
        targets: list[dict[str, Any]],
        group_detr: int = 1,
        target_side_safety: Any = None,
    ) -> Matches | None:
        problem = padded_problem(self, outputs_list, targets, group_detr)
        if problem is None:
            flags.declined += 1
            return original(self, outputs_list, targets, group_detr, target_side_safety)
        sizes, num_queries, group_width = problem
        boxes, classes = outputs_list[0]["pred_boxes"], outputs_list[0]["pred_logits"].shape[-1]
        precomputed = target_side_safety
        if (
            precomputed is not None
            and precomputed.targets is targets
            and precomputed.pred_boxes_dtype == boxes.dtype
            and precomputed.pred_boxes_device == boxes.device
            and precomputed.num_classes == classes
        ):
            checks = [precomputed.safe]
        else:
            checks = [self._target_side_precheck(boxes.dtype, boxes.device, classes, targets)]
        if len(outputs_list) * len(targets) * num_queries * max(sizes) <= matcher_module._STACKED_COST_ELEMENT_LIMIT:
            costs = [cost.float() for cost in self._compute_stacked_compact_cost_matrices(outputs_list, targets)]
        else:
            costs = [
                self._compute_compact_detection_cost_matrix(o, targets, clamp_target_labels=True).float()
                for o in outputs_list
            ]
        limit = torch.finfo(boxes.dtype).max ** 0.5 / 16
        for outputs, cost in zip(outputs_list, costs, strict=True):
            pred = outputs["pred_boxes"]
            checks += [torch.isfinite(pred).all() & (pred.abs() <= limit).all(), torch.isfinite(cost).all()]
        flags.record(torch.stack(checks).all())
        stacked = _assignment._stack_padded(
            [finite_costs(cost) for cost in costs], sizes, group_width, group_detr, max(sizes)
        )
        return matches_from_assignment(solve(stacked), sizes, group_width, group_detr)

    _match_many.safety_flags = flags  # type: ignore[attr-defined]
    return _match_many


def num_boxes_on_device(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `SetCriterion.num_boxes_for_targets`: the count of target boxes is filled into a tensor on the GPU
    instead of copied there from a Python number (a copy that waits); the same value, reduced as rfdetr does."""
    import torch
    from rfdetr.models import criterion as criterion_module

    def num_boxes_for_targets(self: Any, outputs: dict[str, Any], targets: list[dict[str, Any]]) -> Any:
        if targets and "valid" in targets[0]:
            return original(self, outputs, targets)
        num_boxes = sum(len(t["labels"]) for t in targets)
        if not self.sum_group_losses:
            num_boxes *= self.group_detr if self.training else 1
        count = torch.full((), num_boxes, dtype=torch.float, device=self._output_device(outputs))
        if criterion_module.is_dist_avail_and_initialized():
            torch.distributed.all_reduce(count)
        return torch.clamp(count / criterion_module.get_world_size(), min=1.0)

    return num_boxes_for_targets


@contextmanager
def matching_without_waiting() -> Iterator[None]:
    """Within this block, rfdetr's batched matching and its loss's box count do not wait for the GPU (module doc).
    Leaving the block reads the safety flags still in flight."""
    import torch_linear_assignment  # noqa: F401  (rfdetr's train extra; a missing one should fail here, loudly)

    with ExitStack() as patches:
        patches.enter_context(
            patch_rfdetr("rfdetr.models.matcher:HungarianMatcher", "_match_many", match_many_without_waiting)
        )
        patches.enter_context(
            patch_rfdetr("rfdetr.models.criterion:SetCriterion", "num_boxes_for_targets", num_boxes_on_device)
        )
        from rfdetr.models.matcher import HungarianMatcher

        flags = HungarianMatcher._match_many.safety_flags
        try:
            yield
        finally:
            flags.check(wait=True)
            log.info(
                "%s: %d matchings queued without waiting, %d left to rfdetr, %d failed its safety gate",
                WHAT,
                flags.steps,
                flags.declined,
                len(flags.failed),
            )

"""The matching_without_waiting speedup: the same matches and losses as rfdetr's, without reading the GPU's results."""

from __future__ import annotations

import logging

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches import matching_without_waiting as extension
from tests.helpers.rfdetr_steps import decoder_step, solve_all_layers


def as_lists(matches):
    return [[[indices.tolist() for indices in pair] for pair in layer] for layer in matches]


@pytest.mark.parametrize(
    "cost",
    [
        torch.tensor([[1.0, float("nan")], [float("inf"), -2.0]]),
        torch.tensor([[-5.0, float("-inf")], [3.0, -2.0]]),
        torch.full((2, 3), float("nan")),
        torch.tensor([[3e38, float("inf")], [-3e38, 1.0]]),  # the replacement overflows
        torch.randn(4, 5),
    ],
)
def test_non_finite_costs_become_what_rfdetr_makes_of_them(cost):
    from rfdetr.models.matcher import HungarianMatcher

    assert torch.equal(extension.finite_costs(cost), HungarianMatcher._sanitize_cost_matrix(cost))


@pytest.mark.parametrize("sizes", [[3, 1, 4, 2], [0, 2, 0, 5], [1]])
def test_the_assignment_is_cut_into_rfdetrs_index_pairs(sizes):
    """Same padded problems, same solver (on the host here): the pairs equal rfdetr's own unpacking's."""
    import torch_linear_assignment
    from rfdetr.models import _assignment

    torch.manual_seed(len(sizes))
    group_detr, group_width, layers = 3, 6, 2
    costs = [torch.rand(group_detr * group_width, sum(sizes)) for _ in range(layers)]
    stacked = _assignment._stack_padded(costs, sizes, group_width, group_detr, max(sizes))
    ours = extension.matches_from_assignment(
        torch_linear_assignment.batch_linear_assignment(stacked), sizes, group_width, group_detr
    )
    assert as_lists(ours) == as_lists(_assignment._assign_padded(costs, sizes, group_width, group_detr))


def test_the_loss_and_the_matches_are_rfdetrs(tmp_path):
    criterion, outputs, targets = decoder_step("cpu", 6, tmp_path)
    from rfdetr.models.criterion import SetCriterion
    from rfdetr.models.matcher import HungarianMatcher

    originals = HungarianMatcher._match_many, SetCriterion.num_boxes_for_targets
    plain_matches = solve_all_layers(criterion, outputs, targets)
    plain = criterion(outputs, targets)
    with extension.matching_without_waiting():
        assert (HungarianMatcher._match_many, SetCriterion.num_boxes_for_targets) != originals
        matches = solve_all_layers(criterion, outputs, targets)
        ours = criterion(outputs, targets)
        flags = HungarianMatcher._match_many.safety_flags
    assert (flags.steps, flags.declined) == (2, 0)  # both matchings took this path, not rfdetr's
    assert (HungarianMatcher._match_many, SetCriterion.num_boxes_for_targets) == originals  # restored
    assert as_lists(matches) == as_lists(plain_matches)
    assert plain.keys() == ours.keys() and all(torch.equal(plain[k], ours[k]) for k in plain)


def test_a_batch_that_fails_rfdetrs_safety_gate_is_matched_and_named_in_a_warning(tmp_path, caplog):
    criterion, outputs, targets = decoder_step("cpu", 4, tmp_path)
    outputs["pred_boxes"] = outputs["pred_boxes"].clone()
    outputs["pred_boxes"][0, 0, 0] = float("nan")
    assert solve_all_layers(criterion, outputs, targets) is None  # rfdetr declines: layer-by-layer matching
    with caplog.at_level(logging.WARNING), extension.matching_without_waiting():
        healthy = solve_all_layers(criterion, *decoder_step("cpu", 4, tmp_path)[1:])
        broken = solve_all_layers(criterion, outputs, targets)
    assert healthy is not None and broken is not None  # both matched here, on the batched path
    warnings = [r.getMessage() for r in caplog.records if r.name == extension.__name__]
    assert len(warnings) == 1 and warnings[0].startswith("matching step 2 of this process")


def test_batches_the_batched_path_does_not_take_go_to_rfdetr(tmp_path):
    criterion, outputs, targets = decoder_step("cpu", 4, tmp_path)
    single = {k: v[:1] for k, v in outputs.items() if k in ("pred_logits", "pred_boxes")}
    assert extension.padded_problem(criterion.matcher, [single, single], targets[:1], 1) is None  # one image
    crowded = [{**t, "boxes": torch.rand(400, 4), "labels": torch.zeros(400, dtype=torch.int64)} for t in targets]
    layers = [{k: outputs[k] for k in ("pred_logits", "pred_boxes")}] * 2
    assert extension.padded_problem(criterion.matcher, layers, crowded, criterion.group_detr) is None
    assert extension.padded_problem(criterion.matcher, layers, targets, criterion.group_detr) is not None


@pytest.mark.gpu
def test_on_the_gpu_nothing_waits_and_matches_and_losses_equal_rfdetrs(tmp_path):
    criterion, outputs, targets = decoder_step("cuda", 32, tmp_path, resolution=384)
    assert "enc_outputs" in outputs  # at 384 px every layer is matched on the batched path
    plain_matches = solve_all_layers(criterion, outputs, targets)
    plain = criterion(outputs, targets)
    with extension.matching_without_waiting():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any wait for the GPU raises
        try:
            matches = solve_all_layers(criterion, outputs, targets)
            criterion.num_boxes_for_targets(outputs, targets)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        ours = criterion(outputs, targets)
        flags = type(criterion.matcher)._match_many.safety_flags
    assert (flags.steps, flags.declined, flags.failed) == (2, 0, [])
    assert plain_matches is not None, "rfdetr's batched GPU matcher declined these inputs"
    assert all(indices.is_cuda for layer in matches for pair in layer for indices in pair)
    assert as_lists(matches) == as_lists(plain_matches)
    assert plain.keys() == ours.keys() and all(torch.equal(plain[k], ours[k]) for k in plain)

"""two_stage_ranking_without_autograd: a real Nano training step gives rfdetr's loss, gradients and selected
proposals with it, the full-length rows are no longer kept for the backward pass, and evaluation is rfdetr's."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks import applied, select_speedups
from tests.helpers.rfdetr_steps import assert_gradients_alike, nano_and_batch, nano_training_step

SPEEDUP = ["two_stage_ranking_without_autograd"]
# At 64 px the encoder has 16 positions an image; with 10 queries a group the ranking keeps 10 of them, as the
# recipe's 300 of 576 at 384 px, so the rows it leaves out are really left out.
QUERIES = 10


def training_step(tmp_path, speedups: list[str], autocast: bool = False, device: str = "cpu"):
    """One training step of rfdetr's Nano with `speedups` in place: the loss, every parameter's gradient, the
    encoder's proposals as they reach the loss, and how many numbers autograd kept for the backward pass."""
    module, images, targets = nano_and_batch(tmp_path, device, num_queries=QUERIES)
    kept_numbers = [0]

    def kept(tensor):
        kept_numbers[0] += tensor.numel()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(kept, lambda tensor: tensor):
        outputs, loss, grads = nano_training_step(module, images, targets, speedups, autocast, device)
    proposals = {key: value.detach() for key, value in outputs["enc_outputs"].items()}
    return loss, grads, proposals, kept_numbers[0]


@pytest.fixture(scope="module")
def rfdetrs_step(tmp_path_factory):
    return training_step(tmp_path_factory.mktemp("rfdetr"), [])


def test_the_step_gives_rfdetrs_loss_gradients_and_proposals(tmp_path, rfdetrs_step):
    from rfdetr.models.transformer import Transformer

    original = Transformer._two_stage_group_selection
    expected_loss, expected_grads, expected_proposals, _ = rfdetrs_step
    loss, grads, proposals, _ = training_step(tmp_path, SPEEDUP)
    assert Transformer._two_stage_group_selection is original  # rfdetr's method is back after the block
    assert expected_proposals["pred_boxes"].shape == (2, 13 * QUERIES, 4)  # 13 groups of the top 10 of 16
    for key, value in proposals.items():
        assert torch.allclose(value, expected_proposals[key], rtol=1e-5, atol=1e-6), key
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    two_stage = [name for name in grads if ".enc_output" in name or ".enc_out_" in name]
    assert any("enc_output_norm" in name for name in two_stage) and any("enc_out_class" in name for name in two_stage)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


def test_autograd_keeps_less_for_the_backward_pass(tmp_path, rfdetrs_step):
    *_, rfdetr_kept = rfdetrs_step
    *_, kept = training_step(tmp_path, SPEEDUP)
    # rfdetr keeps 13 groups' projection, norm and class scores of all 16 positions; this keeps those of the 10
    # selected, and one copy of the memory's selected rows
    assert kept < rfdetr_kept


def test_under_bf16_autocast_the_step_gives_rfdetrs_within_bf16_rounding(tmp_path):
    expected_loss, expected_grads, expected_proposals, _ = training_step(tmp_path / "rfdetr", [], autocast=True)
    loss, grads, proposals, _ = training_step(tmp_path / "lean", SPEEDUP, autocast=True)
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    assert torch.allclose(proposals["pred_boxes"], expected_proposals["pred_boxes"], atol=2e-2)
    assert_gradients_alike(grads, expected_grads, least_cosine=0.999)


@pytest.mark.gpu
def test_on_the_gpu_the_step_gives_rfdetrs(tmp_path):
    expected_loss, expected_grads, _, _ = training_step(tmp_path / "rfdetr", [], device="cuda")
    loss, grads, _, _ = training_step(tmp_path / "lean", SPEEDUP, device="cuda")
    assert torch.allclose(loss, expected_loss, rtol=1e-3)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-2, atol=1e-4), name


def test_in_evaluation_the_selection_is_rfdetrs(tmp_path):
    outputs = []
    for speedups in ([], SPEEDUP):
        module, images, _ = nano_and_batch(tmp_path, num_queries=QUERIES)
        with applied(select_speedups(speedups, "1.11.2", device_kind="cpu")), torch.no_grad():
            outputs.append(module.model.eval()(images)["pred_boxes"])
    assert torch.equal(*outputs)

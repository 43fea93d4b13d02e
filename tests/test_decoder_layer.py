"""The decoder-layer speedups (decoder_attention_on_views, decoder_relu_in_the_product): a real Nano training step
gives rfdetr's loss and gradients with each, the lean parts are the ones that ran, and evaluation is rfdetr's."""

from __future__ import annotations

import pytest
import torch

from rfdetr_coco_pipeline.hooks import applied, select_speedups
from tests.helpers.rfdetr_steps import BF16_ON_CPU, nano_and_batch, nano_training_step

LEAN = ("decoder_attention_on_views", "decoder_relu_in_the_product")


def module_calls(model) -> dict[str, int]:
    """How often the decoder layers' self-attention and first FFN product will have run as modules."""
    calls = {"self_attn": 0, "linear1": 0}
    for layer in model.transformer.decoder.layers:
        for name in calls:
            getattr(layer, name).register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    return calls


def training_step(tmp_path, speedups: tuple[str, ...], autocast: bool = False, device: str = "cpu", **model: object):
    """The loss and every parameter's gradient of one training step of rfdetr's Nano with `speedups` in place
    (`model`: further RFDETRNanoConfig settings), and how often each decoder layer's self-attention and first FFN
    product ran as modules."""
    module, images, targets = nano_and_batch(tmp_path, device, **model)
    calls = module_calls(module.model)
    _, loss, grads = nano_training_step(module, images, targets, list(speedups), autocast, device)
    return loss, grads, calls


@pytest.fixture(scope="module")
def rfdetrs_step(tmp_path_factory):
    return training_step(tmp_path_factory.mktemp("rfdetr"), ())


@pytest.mark.parametrize("speedups", [LEAN[:1], LEAN[1:], LEAN], ids=["views", "relu_in_product", "both"])
def test_each_lean_part_gives_rfdetrs_loss_and_gradients(tmp_path, rfdetrs_step, speedups):
    from rfdetr.models.transformer import TransformerDecoderLayer

    original = TransformerDecoderLayer.forward_post
    expected_loss, expected_grads, rfdetr_calls = rfdetrs_step
    loss, grads, calls = training_step(tmp_path, speedups)
    assert TransformerDecoderLayer.forward_post is original  # rfdetr's forward is back after the block
    assert rfdetr_calls == {"self_attn": 2, "linear1": 2}  # two decoder layers, each module called once
    # the lean part ran instead of the module it replaces; the other part is rfdetr's
    assert calls["self_attn"] == (0 if "decoder_attention_on_views" in speedups else 2)
    assert calls["linear1"] == (0 if "decoder_relu_in_the_product" in speedups else 2)
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    decoder = [name for name in grads if ".decoder.layers." in name]
    assert any("self_attn.in_proj_weight" in name for name in decoder) and any("linear1" in name for name in decoder)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


def assert_rfdetrs_step_within_bf16_rounding(tmp_path, device: str) -> None:
    model = BF16_ON_CPU if device == "cpu" else {}
    expected_loss, expected_grads, _ = training_step(tmp_path / "rfdetr", (), autocast=True, device=device, **model)
    loss, grads, calls = training_step(tmp_path / "lean", LEAN, autocast=True, device=device, **model)
    assert calls == {"self_attn": 0, "linear1": 0}
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    decoder = [name for name in grads if ".decoder.layers." in name and name.endswith(("weight", "bias"))]
    assert len(decoder) > 10
    for name in decoder:
        assert grads[name].dtype == expected_grads[name].dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(grads[name].flatten(), expected_grads[name].flatten(), dim=0)
        assert cosine > 0.99, name


def test_under_bf16_autocast_the_lean_layer_gives_rfdetrs_step_within_bf16_rounding(tmp_path):
    assert_rfdetrs_step_within_bf16_rounding(tmp_path, "cpu")


@pytest.mark.gpu
def test_on_the_gpu_the_lean_layer_gives_rfdetrs_step(tmp_path):
    """On CUDA the epilogue is cuBLASLt's and the attention kernel a fused one: float32 and bf16 autocast."""
    expected_loss, expected_grads, _ = training_step(tmp_path / "rfdetr", (), device="cuda")
    loss, grads, calls = training_step(tmp_path / "lean", LEAN, device="cuda")
    assert calls == {"self_attn": 0, "linear1": 0}
    assert torch.allclose(loss, expected_loss, rtol=1e-3)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-2, atol=1e-4), name
    assert_rfdetrs_step_within_bf16_rounding(tmp_path, "cuda")


def test_in_evaluation_the_layer_is_rfdetrs(tmp_path):
    outputs = []
    for speedups in ((), LEAN):
        module, images, _ = nano_and_batch(tmp_path)
        model = module.model.eval()
        calls = module_calls(model)
        with applied(select_speedups(list(speedups), "1.11.2", device_kind="cpu")), torch.no_grad():
            outputs.append(model(images)["pred_boxes"])
        assert calls == {"self_attn": 2, "linear1": 2}  # rfdetr's modules ran, not the lean parts
    assert torch.equal(*outputs)

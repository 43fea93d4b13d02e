"""rfdetr's own Nano detector and loss on random images and boxes, for the speedups' tests."""

from __future__ import annotations

import torch

# Under bf16 autocast on a CPU without AVX-512 torch multiplies bf16 matrices on a slow path, and the decoder's 13
# groups of 300 queries make most of a Nano step's products. The CPU's bf16 steps build Nano with 10 queries a group:
# the speedups they check run the same code at any count.
BF16_ON_CPU = {"num_queries": 10}


def tiny_detector_step(device: str, batch: int, tmp_path, resolution: int = 128) -> tuple[object, dict, list[dict]]:
    """rfdetr's own Nano detector and loss, one training-mode forward on random images and boxes."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_model import RFDETRModelModule
    from rfdetr.utilities.tensors import NestedTensor

    torch.manual_seed(0)
    module = RFDETRModelModule(
        RFDETRNanoConfig(pretrain_weights=None, resolution=resolution, device=device),
        TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path)),
    )
    model = module.model.to(device).train()
    pixels = torch.rand(batch, 3, resolution, resolution, device=device)
    images = NestedTensor(pixels, torch.zeros(batch, resolution, resolution, dtype=torch.bool, device=device))
    targets = [
        {"labels": torch.randint(0, 80, (n,), device=device), "boxes": torch.rand(n, 4, device=device) * 0.4 + 0.3}
        for n in [1 + i % 6 for i in range(batch)]
    ]
    with torch.no_grad():
        outputs = model(images, targets)
    return module.criterion, outputs, targets


def nano_and_batch(tmp_path, device: str = "cpu", **model: object):
    """rfdetr's Nano training module (64 px, seeded; `model`: further RFDETRNanoConfig settings) and a batch of two
    random images with their boxes, on `device`."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_model import RFDETRModelModule
    from rfdetr.utilities.tensors import NestedTensor

    torch.manual_seed(0)
    module = RFDETRModelModule(
        RFDETRNanoConfig(pretrain_weights=None, resolution=64, device=device, **model),
        TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path)),
    )
    generator = torch.Generator().manual_seed(1)
    images = NestedTensor(torch.rand(2, 3, 64, 64, generator=generator), torch.zeros(2, 64, 64, dtype=torch.bool))
    targets = [
        {"labels": torch.tensor([3, 7]), "boxes": torch.tensor([[0.4, 0.5, 0.2, 0.3], [0.6, 0.4, 0.1, 0.2]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.3]])},
    ]
    if device != "cpu":
        module.to(device)
        images = images.to(device)
        targets = [{key: value.to(device) for key, value in target.items()} for target in targets]
    return module, images, targets


def nano_training_step(module, images, targets, speedups: list[str], autocast: bool = False, device: str = "cpu"):
    """One training step of `module` (from `nano_and_batch`) with `speedups` in place (selected as on the CPU, so a
    GPU-only one applies when named): its outputs, its loss, and every parameter's gradient."""
    from rfdetr_coco_pipeline.hooks import applied, select_speedups

    model = module.model.train()
    with applied(select_speedups(speedups, "1.11.2", device_kind="cpu")):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            outputs = model(images, targets)
            losses = module.criterion(outputs, targets)
            weights = module.criterion.weight_dict
            loss = sum(losses[k] * weights[k] for k in losses if k in weights)
        loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return outputs, loss.detach(), grads


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().float(), b.flatten().float(), dim=0).item()


def with_direction(expected_grads: dict) -> list[str]:
    """The gradients that are not zero but for rounding (at least 1e-4 of the largest norm): the backbone's key
    biases (softmax ignores a shift every key shares) and box heads behind a last layer that starts at zero have no
    direction to compare."""
    largest = max(grad.norm() for grad in expected_grads.values())
    return [name for name, grad in expected_grads.items() if grad.norm() >= 1e-4 * largest]


def assert_gradients_alike(grads: dict, expected_grads: dict, most_apart: float = 0.0, least_cosine: float = 1.0):
    """Each of `grads` is within `most_apart` of its `expected_grads` one, relative to that one's norm (0: not
    checked), and points its way (cosine at least `least_cosine`; 1: not checked). A gradient that is zero but for
    rounding (`with_direction`) must be so in both. Most must be compared."""
    assert grads.keys() == expected_grads.keys()
    largest = max(grad.norm() for grad in expected_grads.values())
    compared = with_direction(expected_grads)
    for name, grad in grads.items():
        expected = expected_grads[name]
        assert grad.dtype == expected.dtype, name
        if name not in compared:
            assert grad.norm() < 1e-4 * largest, name
            continue
        if most_apart:
            assert (grad - expected).norm() <= most_apart * expected.norm(), name
        if least_cosine < 1.0:
            assert cosine(grad, expected) > least_cosine, name
    assert len(compared) > 0.8 * len(grads)  # most gradients compared, not skipped


def assert_no_further_from_exact(grads: dict, bf16_grads: dict, exact_grads: dict, by: float = 0.005):
    """Under bf16 autocast, each of `grads` points at least as close to the float32 step's (`exact_grads`) as
    rfdetr's own bf16 step's (`bf16_grads`) does, less `by` in cosine: bf16 rounding alone turns some gradients of a
    fresh model by several degrees, so a fixed cosine against rfdetr's bf16 step cannot tell a lever's rounding from
    a fault. Gradients that are zero but for rounding (`with_direction`) are not compared."""
    assert grads.keys() == bf16_grads.keys() == exact_grads.keys()
    compared = with_direction(exact_grads)
    for name in compared:
        assert cosine(grads[name], exact_grads[name]) >= cosine(bf16_grads[name], exact_grads[name]) - by, name
    assert len(compared) > 0.8 * len(grads)


def solve_all_layers(criterion, outputs, targets):
    """rfdetr's batched matching of every decoder layer at once, as its loss calls it in a training step."""
    layers = [{k: v for k, v in outputs.items() if k not in ("aux_outputs", "enc_outputs")}]
    layers += outputs["aux_outputs"] + ([outputs["enc_outputs"]] if "enc_outputs" in outputs else [])
    matcher = criterion.matcher
    return type(matcher)._match_many(matcher, layers, targets, group_detr=criterion.group_detr)


def counted_calls(monkeypatch, module, name: str) -> list[int]:
    """`module.name` counted for the test: the list returned grows by one at each call; the function is unchanged."""
    function = getattr(module, name)
    calls: list[int] = []
    monkeypatch.setattr(module, name, lambda *args: calls.append(1) or function(*args))
    return calls


def index_pairs(matches) -> list[list[tuple[list, list]]]:
    """A matching (per layer, per image: query and target indices) as lists, to compare two."""
    return [[(rows.tolist(), columns.tolist()) for rows, columns in layer] for layer in matches]


def decoder_step(device: str, batch: int, tmp_path, resolution: int = 128):
    """A detector step whose layers all have the same number of queries, as in training at the recipe's 384 px
    (the batched padded path). At 128 px the encoder proposes fewer queries than the decoder layers have (832
    against 3,900), which rfdetr matches on another path, so these tests leave the encoder's layer out there."""
    criterion, outputs, targets = tiny_detector_step(device, batch, tmp_path, resolution)
    if outputs["enc_outputs"]["pred_logits"].shape[1] != outputs["pred_logits"].shape[1]:
        del outputs["enc_outputs"]
    return criterion, outputs, targets


def rfdetr_datamodule(dataset, batch_size: int = 4):
    """rfdetr's own data module, with the workflow's fixed-resolution recipe settings."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_data import RFDETRDataModule

    train_config = TrainConfig(
        dataset_file="coco",
        dataset_dir=str(dataset),
        batch_size=batch_size,
        num_workers=0,
        multi_scale=False,
        square_resize_div_64=True,
    )
    module = RFDETRDataModule(RFDETRNanoConfig(pretrain_weights=None), train_config)
    module.setup("fit")
    return module


def on_device(module, batch, device: str = "cpu"):
    """What the training step receives: Lightning's transfer, then the after-transfer hook."""
    moved = module.transfer_batch_to_device(batch, torch.device(device), 0)
    return module.on_after_batch_transfer(moved, 0)


def assert_same_batch(ours, rfdetr_s) -> None:
    (images, targets), (expected_images, expected_targets) = ours, rfdetr_s
    assert images.tensors.dtype == expected_images.tensors.dtype == torch.float32
    assert torch.equal(images.tensors, expected_images.tensors)
    assert torch.equal(images.mask, expected_images.mask)
    # rfdetr's claim that no image is padded, which lets its model skip the padding mask's work
    assert images.no_padding == expected_images.no_padding
    assert len(targets) == len(expected_targets)
    for mine, theirs in zip(targets, expected_targets, strict=True):
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[key], theirs[key]) for key in mine)

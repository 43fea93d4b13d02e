"""The validation_cuda_graphs speedup: validation's forward passes replay a CUDA graph per batch shape and give the
uncompiled forward pass's outputs; anything it cannot record runs the model as rfdetr does."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten

from rfdetr_extensions.patches.validation_cuda_graphs import GraphedForward, validation_cuda_graphs


def nano_module(tmp_path, resolution: int):
    from rfdetr import RFDETRNano
    from rfdetr.config import TrainConfig
    from rfdetr.training.module_model import RFDETRModelModule

    torch.manual_seed(0)
    config = RFDETRNano(pretrain_weights=None, resolution=resolution).model_config
    module = RFDETRModelModule(config, TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path)))
    return module.eval()


def batch(images: int, resolution: int, device: str):
    from rfdetr.utilities.tensors import nested_tensor_from_tensor_list

    return nested_tensor_from_tensor_list([torch.rand(3, resolution, resolution) for _ in range(images)]).to(device)


def assert_same_outputs(ours, rfdetrs) -> None:
    ours_leaves, ours_structure = tree_flatten(ours)
    rfdetrs_leaves, rfdetrs_structure = tree_flatten(rfdetrs)
    assert ours_structure == rfdetrs_structure
    for mine, theirs in zip(ours_leaves, rfdetrs_leaves, strict=True):
        if isinstance(theirs, torch.Tensor):
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
            assert torch.equal(mine, theirs)
        else:
            assert mine == theirs


def test_on_the_cpu_validation_runs_the_model_as_rfdetr_does(tmp_path):
    module = nano_module(tmp_path, resolution=64)
    samples = batch(2, 64, "cpu")
    forward = GraphedForward()
    with torch.no_grad(), validation_cuda_graphs(forward):
        resolved = module._resolve_eval_model()
        assert resolved.model is module.model  # the very model: the same weights the training updates
        ours = resolved(samples)
    with torch.no_grad():
        assert_same_outputs(ours, module.model(samples))
    assert forward.captures == 0 and forward.replays == 0 and not forward.graphs


@pytest.mark.gpu
def test_on_the_gpu_replays_equal_the_uncompiled_forward_and_follow_the_weights(tmp_path):
    module = nano_module(tmp_path, resolution=384).cuda()
    batches = [batch(4, 384, "cuda") for _ in range(3)]
    forward = GraphedForward()

    def both(samples):
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16), validation_cuda_graphs(forward):
            ours = module._resolve_eval_model()(samples)
            rfdetrs = module.model(samples)
        return ours, rfdetrs

    for samples in batches:
        assert_same_outputs(*both(samples))
    assert forward.captures == 1 and forward.replays == len(batches)

    # weights changed in place, as the EMA update changes them between validations: the replays read them
    with torch.no_grad():
        for parameter in module.model.parameters():
            parameter.mul_(0.99)
    ours, rfdetrs = both(batches[0])
    assert_same_outputs(ours, rfdetrs)
    assert forward.captures == 1 and forward.replays == len(batches) + 1

    # a batch of another size (a validation set's last batch) is captured for its own shape; the training mode and
    # gradients are left to rfdetr's forward
    assert_same_outputs(*both(batch(3, 384, "cuda")))
    assert forward.captures == 2 and not forward.failed
    module.model.train()
    with torch.no_grad(), validation_cuda_graphs(forward):
        module._resolve_eval_model()(batches[0])
    assert forward.captures == 2 and forward.replays == len(batches) + 2

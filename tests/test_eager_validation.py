"""The eager_validation speedup: rfdetr's validation runs the module inside its torch.compile wrapper, so nothing
compiles for validation, and that module gives the wrapped model's outputs (its GPU run: tests/test_gpu.py)."""

from __future__ import annotations

import torch

from rfdetr_coco_pipeline.hooks.patches.eager_validation import eager_validation


def test_validation_runs_the_compiled_models_module_without_compiling_it(tmp_path):
    from rfdetr import RFDETRNano
    from rfdetr.config import TrainConfig
    from rfdetr.training.module_model import RFDETRModelModule
    from rfdetr.utilities.tensors import nested_tensor_from_tensor_list

    torch.manual_seed(0)
    config = RFDETRNano(pretrain_weights=None, resolution=64).model_config
    module = RFDETRModelModule(config, TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path)))
    module.eval()
    compiled_graphs: list[torch.fx.GraphModule] = []

    def recording_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        compiled_graphs.append(graph)
        return graph.forward  # runs the captured graph as it is: the same values as eager

    # as rfdetr does on a GPU with compile: true (module_model.py, setup): its model becomes the compile wrapper
    written = module.model
    module.model = torch.compile(written, backend=recording_backend)
    samples = nested_tensor_from_tensor_list([torch.rand(3, 64, 64), torch.rand(3, 64, 64)])

    with torch.no_grad(), eager_validation():
        resolved = module._resolve_eval_model()
        assert resolved is written  # the very module, so the same parameters the training updates
        ours = resolved(samples)
    assert not compiled_graphs

    with torch.no_grad():
        stocks = module._resolve_eval_model()(samples)  # rfdetr's own choice: the wrapper, which compiles
    assert compiled_graphs
    assert ours.keys() == stocks.keys()
    for key in ("pred_logits", "pred_boxes"):
        assert torch.allclose(ours[key], stocks[key], rtol=1e-5, atol=1e-6), key

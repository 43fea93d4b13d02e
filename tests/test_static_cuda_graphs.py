"""The static_cuda_graphs speedup: the fixed-shape CUDA graph compile applies only where rfdetr's graph replay is on
and every batch has one shape (its GPU path runs in tests/test_gpu.py, where the H200 profile turns it on)."""

from __future__ import annotations


def test_static_graphs_apply_only_to_a_fixed_input_shape_of_a_graph_compiled_model(tmp_path):
    from types import SimpleNamespace

    from rfdetr.config import TrainConfig

    from rfdetr_coco_pipeline.hooks.callbacks.static_cuda_graphs import compile_for_fixed_shape, fixed_input_shape

    fixed = TrainConfig(dataset_dir=str(tmp_path), multi_scale=False, square_resize_div_64=True)
    assert fixed_input_shape(fixed)
    assert not fixed_input_shape(TrainConfig(dataset_dir=str(tmp_path), multi_scale=True, square_resize_div_64=True))
    # as on a CPU or with a profile without cuda_graphs: the model stays as rfdetr built it, and the reason is given
    model = object()
    module = SimpleNamespace(model=model, _inductor_cudagraphs=False, train_config=fixed)
    assert compile_for_fixed_shape(module).startswith("not applied: rfdetr has not enabled CUDA graph replay")
    assert module.model is model

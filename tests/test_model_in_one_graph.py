"""model_in_one_graph: torch.compile makes one graph of rfdetr's Nano instead of six, and the compiled training step
gives the loss and gradients of rfdetr's compiled step; images that need the position table interpolated get
rfdetr's own method."""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tests.helpers.rfdetr_steps import nano_and_batch, nano_training_step

SPEEDUP = "model_in_one_graph"


def compiled_step(tmp_path, speedups: list[str]):
    """One Nano training step through torch.compile (AOTAutograd's graphs run by eager kernels): how many graphs
    Dynamo made, the loss and the gradients."""
    torch._dynamo.reset()
    module, images, targets = nano_and_batch(tmp_path)
    counter = CompileCounterWithBackend("aot_eager")
    module.model = torch.compile(module.model, backend=counter)
    _, loss, grads = nano_training_step(module, images, targets, speedups)
    return counter.frame_count, loss, grads


def test_the_compiled_model_is_one_graph_and_its_step_gives_rfdetrs_loss_and_gradients(tmp_path):
    from rfdetr.models.backbone.dinov2_with_windowed_attn import WindowedDinov2WithRegistersEmbeddings as Embeddings

    original = Embeddings.interpolate_pos_encoding
    rfdetrs_graphs, expected_loss, expected_grads = compiled_step(tmp_path / "rfdetr", [])
    graphs, loss, grads = compiled_step(tmp_path / "one_graph", [SPEEDUP])
    assert Embeddings.interpolate_pos_encoding is original  # rfdetr's method is back after the block
    assert rfdetrs_graphs == 6 and graphs == 1
    assert torch.allclose(loss, expected_loss, rtol=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


def test_images_off_the_tables_grid_get_rfdetrs_interpolated_table(tmp_path):
    from rfdetr_coco_pipeline.hooks.patches.model_in_one_graph import table_inside_the_graph

    module, _, _ = nano_and_batch(tmp_path)
    embeddings = module.model.backbone[0].encoder.encoder.embeddings
    original = type(embeddings).interpolate_pos_encoding
    ours = table_inside_the_graph(original)
    table = embeddings.position_embeddings
    grid = table.shape[1] - 1
    on_grid = torch.zeros(2, grid + 1, table.shape[-1])
    patch = embeddings.config.patch_size
    side = int(grid**0.5) * patch
    assert ours(embeddings, on_grid, side, side) is table
    # a wider image: its patch grid is not the table's, so rfdetr interpolates
    wider = torch.zeros(2, 2 * grid + 1, table.shape[-1])
    expected = original(embeddings, wider, side, 2 * side)
    assert expected.shape[1] == 2 * grid + 1
    assert torch.equal(ours(embeddings, wider, side, 2 * side), expected)

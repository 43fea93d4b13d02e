"""In training, the two-stage proposals of every query group are ranked without autograd, and only the rows they
select are computed again with it.

rfdetr's batched two-stage selection (`Transformer._two_stage_group_selection`) runs each of the 13 groups' encoder
output projection, LayerNorm and class head over every encoder position (576 at 384 px), ranks the positions by
their best class score, and keeps the top 300 of each group. Only those rows reach the loss, yet autograd records
the whole computation: the backward pass scatters the kept rows' gradients into zero tensors of every position, for
13 groups, and runs the LayerNorm and both products backward over all of them, zeros included.

This ranks the positions with the same operations under `torch.no_grad()`, then gathers the selected positions'
encoder memory and computes their projection, LayerNorm and class scores again, with autograd. The box head and
what follows are rfdetr's. The projection, the norm and the head act on each position alone, so the selected rows
are the same function of the same inputs, and every gradient is the same sum without its zero terms: the values are
rfdetr's up to floating-point rounding (a product over fewer rows may round differently). The ranking is rfdetr's own
computation, so the same positions are selected. Evaluation and export never call this method (one group).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr


def selected_with_autograd(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `_two_stage_group_selection` with autograd recording only the selected rows; with autograd off (no
    backward pass to spare) it is `original`."""
    from rfdetr.models import transformer as rfdetr_transformer

    stack = rfdetr_transformer._stack_linear_params
    layer_norm = rfdetr_transformer._batched_group_layer_norm

    def linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        # looked up at each call: group_products_aligned_without_bias_copy may replace it within this block
        return rfdetr_transformer._batched_group_linear(x, weight, bias)

    def _two_stage_group_selection(
        self: Any, output_memory: Tensor, output_proposals: Tensor, group_detr: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if not torch.is_grad_enabled():
            return original(self, output_memory, output_proposals, group_detr)
        bs = output_memory.shape[0]
        topk = min(self.num_queries, output_memory.shape[-2])
        enc_output_weight, enc_output_bias = stack(self.enc_output)
        norm_weight = torch.stack([m.weight for m in self.enc_output_norm])
        norm_bias = torch.stack([m.bias for m in self.enc_output_norm])
        norm_eps = self.enc_output_norm[0].eps
        class_weight, class_bias = stack(self.enc_out_class_embed)

        with torch.no_grad():  # rfdetr's ranking, as it computes it
            memory_expanded = output_memory.unsqueeze(0).expand(group_detr, -1, -1, -1)
            ranked = layer_norm(
                linear(memory_expanded, enc_output_weight, enc_output_bias), norm_weight, norm_bias, norm_eps
            )
            scores = linear(ranked, class_weight, class_bias).max(-1)[0]
            topk_proposals_all = torch.topk(scores, topk, dim=-1)[1]  # (group, bs, topk)

        images = torch.arange(bs, device=output_memory.device).view(1, bs, 1)
        selected_memory = output_memory[images, topk_proposals_all]  # (group, bs, topk, d_model)
        tgt_undetach_all = layer_norm(
            linear(selected_memory, enc_output_weight, enc_output_bias), norm_weight, norm_bias, norm_eps
        )
        cls_logits_selected = linear(tgt_undetach_all, class_weight, class_bias)
        output_proposals_all = output_proposals[images, topk_proposals_all]

        # from here on rfdetr's own steps
        hidden = tgt_undetach_all
        bbox_mlps = self.enc_out_bbox_embed
        num_layers = bbox_mlps[0].num_layers
        for layer_idx in range(num_layers):
            layer_weight, layer_bias = stack([mlp.layers[layer_idx] for mlp in bbox_mlps])
            hidden = linear(hidden, layer_weight, layer_bias)
            if layer_idx < num_layers - 1:
                hidden = F.relu(hidden)
        if self.bbox_reparam:
            coord_cxcy_all = hidden[..., :2] * output_proposals_all[..., 2:] + output_proposals_all[..., :2]
            coord_wh_all = hidden[..., 2:].exp() * output_proposals_all[..., 2:]
            refpoint_embed_all_undetach = torch.concat([coord_cxcy_all, coord_wh_all], dim=-1)
        else:
            refpoint_embed_all_undetach = hidden + output_proposals_all

        def merge_groups(t: Tensor) -> Tensor:  # (group, bs, nq, C) -> (bs, group * nq, C), group 0 first
            return t.permute(1, 0, 2, 3).reshape(bs, group_detr * topk, t.shape[-1])

        return (
            merge_groups(refpoint_embed_all_undetach.detach()),
            merge_groups(tgt_undetach_all),
            merge_groups(refpoint_embed_all_undetach),
            merge_groups(cls_logits_selected),
        )

    return _two_stage_group_selection


def two_stage_ranking_without_autograd() -> AbstractContextManager[None]:
    """Within this block rfdetr's training ranks the two-stage proposals without autograd and computes the selected
    rows again with it (see the module's text)."""
    return patch_rfdetr("rfdetr.models.transformer:Transformer", "_two_stage_group_selection", selected_with_autograd)

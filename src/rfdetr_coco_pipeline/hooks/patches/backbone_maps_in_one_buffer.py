"""In training, the backbone's feature maps are channel slices of one channels-last buffer, not four contiguous
tensors.

rfdetr's backbone (`WindowedDinov2WithRegistersBackbone.forward`) turns each of its four chosen hidden states into a
(batch, width, rows, columns) map with its own `.contiguous()` copy. The projector joins the four along the channels
and its convolutions work channels-last, so in the compiled step the gradient that comes back for each map is a
channel slice of one channels-last tensor. The compiled backbone expects gradients laid out as its outputs were, so
it copies each of the four into a contiguous tensor before its backward starts: four copies of the size of the maps
every step, outside the CUDA graphs. Here the four maps are copied once into one (batch, rows, columns, 4 x width)
buffer and returned as its channel slices, laid out as their gradients arrive: nothing is copied on the way back.

Guarantees: the maps hold rfdetr's values bit for bit (the same copies into another place); they are views that
share one buffer, which nothing downstream writes into. It applies in training when the backbone reshapes its hidden
states into maps; evaluation and export run rfdetr's own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr

BACKBONE = "rfdetr.models.backbone.dinov2_with_windowed_attn:WindowedDinov2WithRegistersBackbone"


def as_grid(tokens: Tensor, image_shape: torch.Size, patch_size: int, num_windows: int) -> Tensor:
    """A hidden state's patch tokens (batch x windows, tokens, width) as (batch, rows, columns, width), the windows
    put back in place: rfdetr's steps, without its last permute and copy."""
    batch_size, _, height, width = image_shape
    rows, columns = height // patch_size, width // patch_size
    if num_windows > 1:
        windows = num_windows**2
        batch_windows, tokens_per_window, channels = tokens.shape
        tokens = tokens.reshape(batch_windows // windows, windows * tokens_per_window, channels)
        tokens = tokens.reshape(
            (batch_windows // windows) * num_windows, num_windows, rows // num_windows, columns // num_windows, channels
        )
        tokens = tokens.permute(0, 2, 1, 3, 4)
    # rfdetr's order of rows and columns, which its own comment calls a bug it keeps from the original
    return tokens.reshape(batch_size, rows, columns, -1)


def maps_as_slices(grids: list[Tensor]) -> tuple[Tensor, ...]:
    """`grids` (each batch, rows, columns, width) copied into one buffer and returned as (batch, width, rows,
    columns) channel slices of it, in order: the layout of the gradient a channels-last concatenation gives them."""
    buffer = torch.cat(grids, dim=-1)
    width = grids[0].shape[-1]
    return tuple(buffer[..., i * width : (i + 1) * width].permute(0, 3, 1, 2) for i in range(len(grids)))


def maps_in_one_buffer(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's backbone forward, its training feature maps slices of one buffer; otherwise `original`."""

    def forward(
        self: Any,
        pixel_values: Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> Any:
        config = self.config
        if not (self.training and config.reshape_hidden_states):
            return original(self, pixel_values, output_hidden_states, output_attentions, return_dict)
        from transformers.modeling_outputs import BackboneOutput

        return_dict = return_dict if return_dict is not None else config.return_dict
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        outputs = self.encoder(
            self.embeddings(pixel_values),
            output_hidden_states=True,
            output_attentions=output_attentions,
            return_dict=return_dict,
        )
        hidden_states = outputs.hidden_states if return_dict else outputs[1]
        grids = []
        for stage, hidden_state in zip(self.stage_names, hidden_states, strict=False):  # as rfdetr pairs them
            if stage in self.out_features:
                if config.apply_layernorm:
                    hidden_state = self.layernorm(hidden_state)
                tokens = hidden_state[:, self.num_register_tokens + 1 :]
                grids.append(as_grid(tokens, pixel_values.shape, config.patch_size, config.num_windows))
        feature_maps = maps_as_slices(grids)
        if not return_dict:
            return (feature_maps,) + (outputs[1:] if output_hidden_states else outputs[2:])
        return BackboneOutput(
            feature_maps=feature_maps,
            hidden_states=outputs.hidden_states if output_hidden_states else None,
            attentions=outputs.attentions if output_attentions else None,
        )

    return forward


def backbone_maps_in_one_buffer() -> AbstractContextManager[None]:
    """Within this block rfdetr's backbone returns its training feature maps as slices of one channels-last buffer
    (see the module's text)."""
    return patch_rfdetr(BACKBONE, "forward", maps_in_one_buffer)

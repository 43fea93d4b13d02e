"""In training, the backbone's feed-forward blocks apply GELU's derivative in the Triton product that makes the
gradient it multiplies.

Each of the backbone's 12 blocks ends in fc2(gelu(fc1(x))), 1,536 wide (`Dinov2WithRegistersMLP`). Backward, cuBLAS
writes the gradient of GELU's output and a second kernel reads it again, with GELU's input, to multiply it by GELU's
derivative. Here the block runs as `feed_forward_products.FeedForwardGELU`, whose backward makes GELU's input
gradient in one Triton kernel that applies the derivative to each tile as it writes it.

Guarantees: the block's output is rfdetr's, and every gradient rfdetr's up to floating-point rounding. It applies
to a block of two `nn.Linear` with biases around transformers' exact GELU, in training (gradients on, the module in
training mode), where the kernel can run (CUDA; Triton's interpreter in the tests); any other call, and every call
outside training (evaluation, export), is rfdetr's own. For backward the block keeps GELU's input and output, as
autograd of rfdetr's block does; compiled, Inductor may choose to keep less of rfdetr's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfdetr_coco_pipeline.hooks.patches.feed_forward_products import FeedForwardGELU, feed_forward
from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr, triton_kernels_run_on

MLP = "rfdetr.models.backbone.dinov2_with_windowed_attn:Dinov2WithRegistersMLP"


def _exact_gelu(activation: nn.Module) -> bool:
    from transformers.activations import GELUActivation

    return type(activation) is GELUActivation and activation.act is F.gelu


def _applies(mlp: nn.Module, x: Tensor) -> bool:
    return (
        mlp.training
        and torch.is_grad_enabled()
        and type(mlp.fc1) is nn.Linear
        and type(mlp.fc2) is nn.Linear
        and mlp.fc1.bias is not None
        and mlp.fc2.bias is not None
        and _exact_gelu(mlp.activation)
        and triton_kernels_run_on(x)
    )


def gelu_grad_in_product(original: Callable[..., Any]) -> Callable[..., Any]:
    """rfdetr's `Dinov2WithRegistersMLP.forward` through `FeedForwardGELU` in training; otherwise `original`."""

    def forward(self: Any, hidden_state: Tensor) -> Tensor:
        if not _applies(self, hidden_state):
            return original(self, hidden_state)
        return feed_forward(FeedForwardGELU, self.fc1, self.fc2, hidden_state)

    return forward


def backbone_gelu_grad_in_the_product() -> AbstractContextManager[None]:
    """Within this block rfdetr's backbone feed-forward blocks make GELU's input gradient in one Triton product in
    training (see the module's text)."""
    return patch_rfdetr(MLP, "forward", gelu_grad_in_product)

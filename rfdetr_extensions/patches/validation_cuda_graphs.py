"""Replay validation's forward pass as a CUDA graph, one graph for the validation batch's one shape.

The train stage validates with the uncompiled model (`eager_validation`), so each validation batch's forward pass
is launched from Python kernel by kernel: on the H200 the host takes about 2 s of a validation of COCO's 5,000
images to launch forward passes whose GPU work is a fraction of that (BENCHMARKS.md, "Validation"). A CUDA graph
records the forward pass once and launches it whole afterwards.

This wraps `RFDETRModelModule._resolve_eval_model` (after `eager_validation`'s wrap, when both apply): the model
validation runs becomes `GraphedForward`, which for a CUDA batch of a shape it has seen copies the batch into the
graph's input buffers, replays the graph and returns copies of its outputs. The first batch of a shape runs once
uncaptured on a side stream (the warm-up a capture needs), is captured, and is then replayed like any other. For
the capture the model's transformer keeps its feature maps' sizes as one device tensor (rfdetr's own switch for its
training graphs), as a capture cannot copy them from the host; afterwards the switch is as it was. A graph
belongs to one model and its weight tensors (their addresses), its input shape and the autocast settings; the EMA
weights change in place between validations, which a replay reads. A batch of another shape (the last, smaller
one), a model in training mode, one with Transformer Engine layers (the FP8 route), a CPU batch, or gradients on
run the model as rfdetr does; so does every batch after a capture that failed, which is logged once.

Guarantees: the same kernels on the same inputs and weights as the uncompiled forward pass, so the same outputs;
only how they are launched changes. The capture disables autocast's weight cache (a cached cast from the warm-up
must not be read by the graph). Shown on the GPU by
`tests/test_validation_cuda_graphs.py::test_on_the_gpu_replays_equal_the_uncompiled_forward_and_follow_the_weights`;
the train stage's metrics with it by `tests/test_gpu.py`.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from rfdetr_extensions.patching import patch_rfdetr

log = logging.getLogger(__name__)

# A shape per model seen in one validation (the regular and the EMA model before and after the EMA's warm-up):
# graphs beyond these would hold GPU memory for models no longer validated.
MAX_GRAPHS = 2


@dataclass
class Captured:
    graph: Any
    static_tensors: Any
    static_mask: Any
    outputs: Any
    kept: dict[Any, Any]  # tensors the graph reads that the model built before the capture
    replays: int = 0


@contextmanager
def spatial_shapes_kept(model: Any) -> Iterator[dict[Any, Any]]:
    """Within this block the model's transformer builds its feature maps' sizes as a device tensor once and reuses
    it (rfdetr's `Transformer.enable_cuda_graph_capture`, which its own graph runner calls), instead of copying them
    from the host at each forward pass, which a capture refuses. Yields that cache, which the graph reads; afterwards
    the transformer is as it was, so its eager and compiled forward passes elsewhere do not change."""
    transformer = getattr(model, "transformer", None)
    previous = getattr(transformer, "_cuda_graph_spatial_shapes", None)
    if previous is not None or not callable(getattr(transformer, "enable_cuda_graph_capture", None)):
        yield previous if previous is not None else {}
        return
    transformer.enable_cuda_graph_capture()
    try:
        yield transformer._cuda_graph_spatial_shapes
    finally:
        transformer._cuda_graph_spatial_shapes = previous


def has_transformer_engine_layers(model: Any) -> bool:
    return any(type(layer).__module__.startswith("transformer_engine") for layer in model.modules())


class GraphedForward:
    """A validation model's forward pass, replayed from CUDA graphs where it can be (see the module's text)."""

    def __init__(self) -> None:
        self.graphs: OrderedDict[tuple[Any, ...], Captured] = OrderedDict()
        self.failed: str | None = None
        self.captures = 0

    @property
    def replays(self) -> int:
        return sum(captured.replays for captured in self.graphs.values())

    def key(self, model: Any, samples: Any) -> tuple[Any, ...] | None:
        """What a graph is recorded for, or None where the batch runs uncaptured."""
        import torch

        tensors, mask = getattr(samples, "tensors", None), getattr(samples, "mask", None)
        if self.failed or not isinstance(tensors, torch.Tensor) or not tensors.is_cuda or mask is None:
            return None
        if model.training or torch.is_grad_enabled() or has_transformer_engine_layers(model):
            return None
        weights = tuple(tensor.data_ptr() for tensor in itertools.chain(model.parameters(), model.buffers()))
        autocast = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
        shapes = (tuple(tensors.shape), tensors.dtype, tuple(mask.shape), bool(getattr(samples, "no_padding", False)))
        return (id(model), weights, autocast, tensors.device, shapes)

    def __call__(self, model: Any, samples: Any) -> Any:
        key = self.key(model, samples)
        if key is None:
            return model(samples)
        captured = self.graphs.get(key)
        if captured is None:
            captured = self.capture(model, samples, key)
            if captured is None:
                return model(samples)
        return self.replay(captured, samples)

    def capture(self, model: Any, samples: Any, key: tuple[Any, ...]) -> Captured | None:
        import torch
        from rfdetr.utilities.tensors import NestedTensor

        while len(self.graphs) >= MAX_GRAPHS:
            self.graphs.popitem(last=False)
        static = NestedTensor(samples.tensors.clone(), samples.mask.clone(), getattr(samples, "no_padding", False))
        autocast_on, autocast_dtype = key[2]
        side = torch.cuda.Stream(device=samples.tensors.device)
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        try:
            with (
                spatial_shapes_kept(model) as kept,
                torch.cuda.stream(side),
                torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_on, cache_enabled=False),
            ):
                model(static)  # the warm-up: lazy initialisations happen outside the capture
                with torch.cuda.graph(graph, stream=side):
                    outputs = model(static)
        except Exception as error:  # noqa: BLE001  (any failure: validate uncaptured, as rfdetr does)
            self.failed = f"{type(error).__name__}: {error}"
            log.warning("Validation CUDA graphs: capture failed (%s); validation runs uncaptured.", self.failed)
            torch.cuda.current_stream().wait_stream(side)
            return None
        torch.cuda.current_stream().wait_stream(side)
        captured = Captured(graph, static.tensors, static.mask, outputs, kept)
        self.graphs[key] = captured
        self.captures += 1
        log.info("Validation CUDA graphs: captured the forward pass of batches of shape %s", key[4][0])
        return captured

    def replay(self, captured: Captured, samples: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_map

        captured.static_tensors.copy_(samples.tensors)
        captured.static_mask.copy_(samples.mask)
        captured.graph.replay()
        captured.replays += 1
        # copies, so that no caller holds buffers the next replay overwrites
        return tree_map(lambda value: value.clone() if isinstance(value, torch.Tensor) else value, captured.outputs)


class ReplayingModel:
    """The model `_resolve_eval_model` chose, called through `GraphedForward`; anything else goes to the model."""

    def __init__(self, model: Any, forward: GraphedForward) -> None:
        self.model = model
        self.forward = forward

    def __call__(self, samples: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return self.model(samples, *args, **kwargs)
        return self.forward(self.model, samples)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def resolving_replayed(forward: GraphedForward) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    def wrap(resolve: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def resolve_eval_model(module: Any) -> Any:
            model = resolve(module)
            if hasattr(model, "_orig_mod"):  # a torch.compile wrapper (eager_validation off): its own graphs
                return model
            return ReplayingModel(model, forward)

        return resolve_eval_model

    return wrap


def validation_cuda_graphs(forward: GraphedForward | None = None) -> AbstractContextManager[None]:
    """Within this block, rfdetr's validation forward passes replay CUDA graphs where they can (see module doc)."""
    return patch_rfdetr(
        "rfdetr.training.module_model:RFDETRModelModule",
        "_resolve_eval_model",
        resolving_replayed(forward or GraphedForward()),
    )

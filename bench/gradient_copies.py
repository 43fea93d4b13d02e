"""The gradients a compiled training step copies into another memory layout before a graph's backward, counted on
the CPU.

usage: python -m bench.gradient_copies [--speedups all] [--resolution 64] [--num-queries 30] [--steps 2]
           [--out FILE.json]

torch.compile splits rfdetr's model into several graphs (rfdetr keeps its position-encoding interpolation out of
them). When the gradient that comes back for a graph's output is laid out otherwise than the forward laid out that
output, AOTAutograd copies it into the forward's layout before the graph's backward starts; on a GPU those copies
run outside the CUDA graphs. This tool compiles rfdetr's Nano (random weights, one fixed input shape, as the train
stage compiles it), runs training steps on two synthetic images with `--speedups` in place, and counts those copies
per step by shape and layout. The first step compiles (minutes on the CPU); the count of the last step is the one a
training step repeats. Inductor may lay tensors out otherwise on a GPU: what a GPU step copies is in the trace
`bench.profile_steps --trace` writes, read by `bench.trace_ops`.
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


@contextmanager
def counting_gradient_copies() -> Iterator[collections.Counter]:
    """Within this block, each gradient that AOTAutograd copies into its graph's layout is counted in the Counter
    yielded, keyed by (shape, strides it came with, strides it was copied to, dtype). torch's function that makes
    the copy is looked up by name: a torch without it raises AttributeError here, not a count of zero."""
    import torch._dynamo  # noqa: F401  (loads AOTAutograd's runtime)
    from torch._functorch._aot_autograd import runtime_wrappers

    copies: collections.Counter = collections.Counter()
    coerce = runtime_wrappers.coerce_to_expected_memory_format

    def counted(tensor: torch.Tensor, memory_format: Any) -> torch.Tensor:
        coerced = coerce(tensor, memory_format)
        if coerced is not tensor:
            key = (tuple(tensor.shape), tensor.stride(), coerced.stride(), str(tensor.dtype).removeprefix("torch."))
            copies[key] += 1
        return coerced

    runtime_wrappers.coerce_to_expected_memory_format = counted
    try:
        yield copies
    finally:
        runtime_wrappers.coerce_to_expected_memory_format = coerce


def copies_per_step(names: list[str], resolution: int, num_queries: int, steps: int) -> list[dict]:
    """Each step's copies (a list of {shape, strides, copied_to, dtype, count}) of rfdetr's Nano compiled as one
    fixed shape, trained on two synthetic images with the speedups `names` each applied as on a GPU (a kernel that
    runs on CUDA only falls back to rfdetr's code on the CPU), so that two lists differ only in what they name."""
    from types import SimpleNamespace

    from bench.flops import synthetic_batch, training_module
    from rfdetr_coco_pipeline.hooks import applied, select_speedups
    from rfdetr_coco_pipeline.versions import package_version

    module = training_module(resolution, 2, num_queries=num_queries)
    compiled = torch.compile(module.model, dynamic=False)
    images, targets = synthetic_batch(2, resolution)
    weights = module.criterion.weight_dict
    per_step = []
    selection = select_speedups(names, package_version("rfdetr"), device_kind="cpu")
    with applied(selection, SimpleNamespace(loader_niceness=0)):  # no data loader here to nice
        for _ in range(steps):
            module.model.zero_grad(set_to_none=True)
            with counting_gradient_copies() as copies:
                losses = module.criterion(compiled(images, targets), targets)
                sum(losses[k] * weights[k] for k in losses if k in weights).backward()
            per_step.append(
                [
                    {"shape": list(shape), "strides": list(strides), "copied_to": list(to), "dtype": dtype, "count": n}
                    for (shape, strides, to, dtype), n in copies.most_common()
                ]
            )
    return per_step


def main(argv: list[str] | None = None) -> dict:
    from bench.profile_steps import parse_speedups
    from rfdetr_coco_pipeline.hooks import wanted_names

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speedups", default="all", type=parse_speedups)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--num-queries", type=int, default=30, help="a group's queries (Nano trains 300)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = wanted_names(args.speedups)
    per_step = copies_per_step(names, args.resolution, args.num_queries, args.steps)
    result = {
        "speedups": names,
        "resolution": args.resolution,
        "num_queries": args.num_queries,
        "torch": torch.__version__,
        "copies_per_step": [sum(copy["count"] for copy in step) for step in per_step],
        "last_step": per_step[-1],
    }
    for copy in per_step[-1]:
        print(f"{copy['count']} x {copy['dtype']} {copy['shape']}: strides {copy['strides']} -> {copy['copied_to']}")
    print(f"gradients copied per step: {result['copies_per_step']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()

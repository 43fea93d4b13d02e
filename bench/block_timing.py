"""Timing a piece of a training step, forward and backward, on the inputs it gets: GPU-busy time with each kernel's
share on CUDA, wall time on the CPU; and several blocks that compute the same function timed side by side.

Shared by bench.part_times (a step's time by model part) and the side-by-side tools of single blocks
(bench.decoder_self_attention, bench.decoder_ffn).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bench.profile_steps import annotation_names, union_seconds


def tensors_in(value: Any) -> Iterator[Tensor]:
    """The tensors in a nest of tuples, lists and dicts (a module's outputs), in order."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def detached(value: Any) -> Any:
    """`value` with every tensor copied off the autograd graph; a copy of one that needed a gradient needs one too,
    so the part's backward computes the gradients of its inputs as in the step."""
    if isinstance(value, Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_(value.requires_grad) if copy.is_floating_point() else copy
    if isinstance(value, (tuple, list)):
        return type(value)(detached(item) for item in value)
    if isinstance(value, dict):
        return {key: detached(item) for key, item in value.items()}
    return value


class Timer:
    """Runs a piece of work repeatedly and returns its milliseconds per run: GPU-busy time on CUDA (the union of its
    kernels', copies' and memsets' intervals, without the profiler's annotations), wall time on the CPU. On CUDA,
    `kernels` holds the last work's milliseconds per run of each kernel name. With `trace` set, the next timed runs
    are also written there as torch.profiler's trace (gzipped; `bench.trace_ops` reads it)."""

    def __init__(self, device: torch.device, repeats: int, warmup: int) -> None:
        self.device, self.repeats, self.warmup = device, repeats, warmup
        self.kernels: Counter[str] = Counter()
        self.trace: Path | None = None

    def __call__(self, work: Callable[[], None]) -> float:
        for _ in range(self.warmup):
            work()
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        if self.device.type != "cuda":
            times = []
            traced = profile(activities=[ProfilerActivity.CPU], record_shapes=True) if self.trace else nullcontext()
            with traced as profiler:
                for _ in range(self.repeats):
                    start = time.perf_counter()
                    work()
                    times.append(time.perf_counter() - start)
            self._write_trace(profiler)
            return 1e3 * statistics.median(times)
        torch.cuda.synchronize()
        # the inputs' shapes only in a trace written for bench.trace_ops, which names them beside each operation
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=activities, record_shapes=self.trace is not None) as profiler:
            for _ in range(self.repeats):
                work()
            torch.cuda.synchronize()
        self._write_trace(profiler)
        kineto = profiler.profiler.kineto_results.events()
        labels = annotation_names(kineto)  # shown on the GPU's timeline, but no work: as bench.profile_steps counts
        events = [e for e in kineto if e.device_type() == DeviceType.CUDA and e.name() not in labels]
        self.kernels = Counter()
        for event in events:
            self.kernels[event.name()] += event.duration_ns() / 1e6 / self.repeats
        return 1e3 * union_seconds([(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events]) / self.repeats

    def _write_trace(self, profiler: Any) -> None:
        if self.trace is not None:
            profiler.export_chrome_trace(str(self.trace))  # a name ending .gz is written gzipped
            self.trace = None


def forward_and_backward(
    function: Callable[..., Any], args: tuple, kwargs: dict, autocast: Any, params: list[nn.Parameter]
) -> Callable[[], None]:
    """One run of `function` on the inputs, forward under `autocast`, backward from fixed random gradients of its
    outputs that need one; parameter and input gradients are cleared first, as at the start of a step."""
    leaves = [t for t in [*tensors_in(args), *tensors_in(kwargs)] if t.requires_grad]
    gradients: list[Tensor] = []

    def work() -> None:
        for tensor in [*leaves, *params]:
            tensor.grad = None
        with autocast:
            outputs = [t for t in tensors_in(function(*args, **kwargs)) if t.requires_grad]
        if not gradients:
            generator = torch.Generator(outputs[0].device).manual_seed(0)
            gradients.extend(torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype) for t in outputs)
        torch.autograd.backward(outputs, gradients)

    return work


def side_by_side(
    blocks: dict[str, Callable[..., Tensor]],
    inputs: tuple[Tensor, ...],
    params: list[nn.Parameter],
    timer: Timer,
    compile_blocks: bool,
    calls_per_step: int = 1,
) -> dict[str, Any]:
    """Each block of `blocks` on `inputs`, compiled on its own unless not `compile_blocks`, forward (bf16 autocast on
    CUDA) and backward, timed by `timer`: ms per step (`calls_per_step` calls) and, on CUDA, its costliest kernels."""
    device = inputs[0].device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    result: dict[str, Any] = {"device": str(device), "compiled": compile_blocks, "ms_per_step": {}}
    for name, block in blocks.items():
        function = torch.compile(block, dynamic=False) if compile_blocks else block
        work = forward_and_backward(lambda *a, f=function: (f(*a),), inputs, {}, autocast, params)
        result["ms_per_step"][name] = round(calls_per_step * timer(work), 3)
        if timer.kernels:
            result.setdefault("kernels", {})[name] = [
                {"kernel": kernel[:120], "ms": round(calls_per_step * ms, 3)}
                for kernel, ms in timer.kernels.most_common(8)
            ]
    first = next(iter(result["ms_per_step"].values()))
    for name, ms in result["ms_per_step"].items():
        print(f"{ms:9.3f} ms per step  {first / ms:5.2f}x  {name}")
    return result


def side_by_side_main(description: str, measure: Callable[[int, int, int, bool], dict[str, Any]]) -> None:
    """The command line of a side-by-side tool: --batch, --repeats, --warmup, --no-compile, --out."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = measure(args.batch, args.repeats, args.warmup, not args.no_compile)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")

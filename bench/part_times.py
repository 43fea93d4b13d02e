"""Where a training step's GPU time goes, by model part: each part's forward and backward timed on its own, on the
inputs it gets in a real step, next to the whole step.

usage: python -m bench.part_times [--resolution 384] [--batch 128] [--repeats 10] [--warmup 3] [--no-compile]
           [--speedups auto|none|all|NAME,...] [--only REGEX] [--kernels N] [--trace FILE.trace.json.gz]
           [--inductor KEY=VALUE ...] [--out FILE.json]

Builds rfdetr's Nano training module (as bench.flops does: random weights, 13 decoder groups) with the registry's
patches that `--speedups` selects in place, runs one step on synthetic images and boxes and keeps every input each
part (PARTS) was called with. Then, for each part: its calls of that step, each compiled on its own (torch.compile,
static shapes, unless --no-compile) and run forward under the recipe's autocast (bf16 on the GPU) and backward with
fixed random output gradients, `--repeats` times after `--warmup`. The loss (rfdetr's criterion with its Hungarian
matching, on the step's outputs; its layer-batched losses compiled on the GPU unless --no-compile, as rfdetr runs
them for a model compiled for one shape) and the optimizer (torch's AdamW, fused on the GPU, over every parameter) are
timed the same way, and the whole step (the compiled model, the loss, the backward and the optimizer) last.
`--only` times only the rows whose label it finds ("loss" for the loss alone); `--kernels N` lists each row's N
kernels with the most GPU time (on the GPU); `--trace` writes the whole step's timed runs as torch.profiler's trace,
whose kernels `python -m bench.trace_ops FILE --steps <repeats>` traces to the operations that launched them.
`--inductor combo_kernels=True` compiles with that `torch._inductor.config` setting (a Python literal), for timing
Inductor's own options against its defaults; the record names them.

On the GPU each figure is GPU-busy milliseconds (the union of the kernels' intervals under torch.profiler, per
step), so host launch gaps that the workflow's CUDA graphs remove are not counted; on the CPU it is wall time.
Parts are timed apart, so fusions across a part's edge are lost and the parts can sum to more than the whole: the
record gives both, and each part's share of the parts' sum. A part nested in another (the decoder's layers inside
the transformer) is a row under it, and the rest of its parent (what none of its rows covers) is a row too. A part
that a speedup computes inside its parent (the decoder's self-attention with `decoder_attention_on_views`) is not
called as a module: the record names it in `parts_not_called` and gives its parent no rest row; `--speedups
all,-decoder_attention_on_views` times it apart.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import Tensor, nn

from bench.block_timing import Timer, detached, forward_and_backward
from bench.flops import synthetic_batch, training_module
from bench.profile_steps import parse_speedups


@dataclass(frozen=True)
class Part:
    """A row of the table: the module paths it covers (a regular expression over `named_modules` paths) and the
    part it sits in (None: the step's top level)."""

    label: str
    paths: str
    parent: str | None = None


TRANSFORMER = "transformer (two-stage proposals, decoder)"
# rfdetr 1.11.2's module paths for Nano. A top-level part counts the calls made outside every other top-level part:
# the box head that the decoder also calls for its reference points counts under the transformer there. No part
# hooks the two-stage heads (`transformer.enc_*`) or the matcher: rfdetr runs their 13 groups in one batched pass
# only when no hook is registered on them, so hooking them would time a path the step does not take. The two-stage
# proposals are in the rest of the transformer.
PARTS = (
    Part("backbone blocks (patch embedding, 12 windowed blocks)", r"backbone\.0\.encoder"),
    Part("projector", r"backbone\.0\.projector"),
    Part(TRANSFORMER, r"transformer"),
    Part("decoder layers (2)", r"transformer\.decoder\.layers\.\d+", TRANSFORMER),
    Part("decoder self-attention", r"transformer\.decoder\.layers\.\d+\.self_attn", "decoder layers (2)"),
    Part("deformable cross-attention", r"transformer\.decoder\.layers\.\d+\.cross_attn", "decoder layers (2)"),
    Part("reference point head", r"transformer\.decoder\.ref_point_head", TRANSFORMER),
    Part("class and box heads", r"class_embed|bbox_embed"),
)
TOP_LEVEL = {part.label for part in PARTS if part.parent is None}


@dataclass
class Call:
    """One call of a module in the captured step: the module, its inputs, and the parts it was called inside."""

    path: str
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inside: tuple[str, ...] = field(default_factory=tuple)


def part_of(path: str, inside: tuple[str, ...]) -> list[str]:
    """The labels of the rows a call of module `path` counts in: a top-level row when no other top-level part was
    running, a nested row when its parent part was."""
    running = {p.label for p in PARTS for outer in inside if re.fullmatch(p.paths, outer)}
    rows = []
    for part in PARTS:
        if not re.fullmatch(part.paths, path):
            continue
        if (part.parent is None and not running & TOP_LEVEL) or part.parent in running:
            rows.append(part.label)
    return rows


@contextmanager
def captured_calls(model: nn.Module) -> Iterator[list[Call]]:
    """Within this block, every call of a module that a part covers is recorded with copies of its inputs."""
    calls: list[Call] = []
    running: list[str] = []
    handles = []
    for path, module in model.named_modules():
        if not any(re.fullmatch(part.paths, path) for part in PARTS):
            continue

        def before(module: nn.Module, args: tuple, kwargs: dict, path: str = path) -> None:
            calls.append(Call(path, module, detached(args), detached(kwargs), tuple(running)))
            running.append(path)

        def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            running.pop()

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


LOSS, OPTIMIZER, WHOLE = "loss (matching, criterion)", "optimizer (AdamW step)", "whole step"


def measure(
    resolution: int,
    batch: int,
    repeats: int,
    warmup: int,
    compile_parts: bool,
    only: str = ".*",
    kernels: int = 0,
    trace: Path | None = None,
) -> dict[str, Any]:
    """The table: milliseconds per step of each part, the loss, the optimizer and the whole step; with `only`, the
    rows whose label it matches (a regular expression). With `kernels` (on CUDA), also each row's `kernels` kernels
    with the most GPU time. With `trace`, the whole step's timed runs are written there as a profiler trace."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    module = training_module(resolution, batch).to(device)
    model, criterion = module.model, module.criterion
    samples, targets = synthetic_batch(batch, resolution)
    samples = samples.to(device)
    targets = [{key: value.to(device) for key, value in target.items()} for target in targets]
    params = [p for p in model.parameters() if p.requires_grad]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    compiled = (lambda f: torch.compile(f, dynamic=False)) if compile_parts else (lambda f: f)
    if compile_parts:
        # as rfdetr does for a model compiled for one input shape (and the static_cuda_graphs speedup)
        criterion.enable_compiled_detection_losses()

    def loss_of(outputs: Any) -> Tensor:
        losses = criterion(outputs, targets)
        return sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)

    with captured_calls(model) as calls, autocast:
        outputs = model(samples, targets)
    time_of = Timer(device, repeats, warmup)
    wanted = [part.label for part in PARTS if re.search(only, part.label)]
    rows: dict[str, float] = {label: 0.0 for label in wanted}
    row_kernels: dict[str, Counter[str]] = defaultdict(Counter)

    def timed(labels: list[str], work: Callable[[], None]) -> None:
        milliseconds = time_of(work)
        for label in labels:
            rows[label] = rows.get(label, 0.0) + milliseconds
            row_kernels[label].update(time_of.kernels)

    for call in calls:
        labels = [label for label in part_of(call.path, call.inside) if label in wanted]
        if labels:
            timed(labels, forward_and_backward(compiled(call.module), call.args, call.kwargs, autocast, params))
    # a part a speedup computes inside its parent (decoder_attention_on_views) is not called as a module: no row
    not_called = [label for label in wanted if not any(label in part_of(c.path, c.inside) for c in calls)]
    for label in not_called:
        del rows[label]
    extra_rows = {"parts_not_called": not_called} if not_called else {}
    if re.search(only, LOSS):
        timed([LOSS], forward_and_backward(lambda o: (loss_of(o),), (detached(outputs),), {}, autocast, params))
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4, fused=device.type == "cuda")
    if re.search(only, OPTIMIZER):
        timed([OPTIMIZER], optimizer.step)

    def with_kernels(record: dict[str, Any]) -> dict[str, Any]:
        top = {
            label: [{"kernel": name[:120], "ms": round(ms, 3)} for name, ms in counter.most_common(kernels)]
            for label, counter in row_kernels.items()
            if kernels and counter
        }
        return record | ({"kernels": top} if top else {}) | extra_rows

    if not re.search(only, WHOLE):
        return with_kernels(table(rows, None, resolution, batch, device, compile_parts))
    # the recorded inputs hold the recording step's autograd graph, and with it every activation: freed before the
    # whole step, which needs the memory of a step of its own
    del calls, outputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    whole_model = compiled(model)

    def whole_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_of(whole_model(samples, targets))
        loss.backward()
        optimizer.step()

    time_of.trace = trace
    whole = time_of(whole_step)
    row_kernels[WHOLE].update(time_of.kernels)
    return with_kernels(table(rows, whole, resolution, batch, device, compile_parts))


def table(
    rows: dict[str, float], whole: float | None, resolution: int, batch: int, device: torch.device, compiled: bool
) -> dict[str, Any]:
    """The record: each row's milliseconds and share of the top-level rows' sum, in the table's order (a part, then
    its rows, then a "rest of" row for what they leave of it, when all were timed), and the whole step (None: not
    timed)."""
    parents = {label: None for label in rows} | {part.label: part.parent for part in PARTS}
    ordered: list[tuple[str, float, str | None, int]] = []

    def add(label: str, depth: int) -> None:
        ordered.append((label, rows[label], parents[label], depth))
        inner = [child for child, parent in parents.items() if parent == label]
        for child in inner:
            if child in rows:
                add(child, depth + 1)
        if inner and all(child in rows for child in inner):
            rest = rows[label] - sum(rows[child] for child in inner)
            ordered.append((f"rest of {label}", rest, label, depth + 1))

    for label in rows:
        if parents[label] is None or parents[label] not in rows:
            add(label, 0)
    top_sum = sum(ms for _, ms, _, depth in ordered if depth == 0)
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "resolution": resolution,
        "batch": batch,
        "compiled_per_part": compiled,
        "measure": "GPU-busy ms per step" if device.type == "cuda" else "wall ms per step",
        "whole_step_ms": None if whole is None else round(whole, 2),
        "parts_sum_ms": round(top_sum, 2) if ordered else None,
        "rows": [
            {
                "part": label,
                "within": parent,
                "depth": depth,
                "ms": round(ms, 2),
                "share_of_parts_sum": round(ms / top_sum, 4) if top_sum else 0.0,
            }
            for label, ms, parent, depth in ordered
        ],
    }


def speedups_setting(value: str) -> str | list[str]:
    """--speedups: auto, as train.speedups takes it, or what bench.profile_steps takes."""
    return value if value == "auto" else parse_speedups(value)


def inductor_setting(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` as a `torch._inductor.config` name and its value (a Python literal); the name must exist."""
    import ast

    key, separator, value = text.partition("=")
    if not separator or not hasattr(inductor_config, key):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE with KEY a torch._inductor.config setting")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError) as error:
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not a Python literal ({error})") from None


def main() -> None:
    from rfdetr_coco_pipeline.hooks import applied, select_speedups
    from rfdetr_coco_pipeline.versions import package_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolution", type=int, default=384)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="time the parts as written, not compiled")
    parser.add_argument("--speedups", type=speedups_setting, default="auto", help="the registry's, as train.speedups")
    parser.add_argument("--only", default=".*", help="time only the rows whose label this regular expression finds")
    parser.add_argument("--kernels", type=int, default=0, help="on the GPU: each row's N costliest kernels too")
    parser.add_argument("--trace", type=Path, help="the whole step's profiler trace, to write (.json.gz)")
    parser.add_argument(
        "--inductor", type=inductor_setting, action="append", default=[], help="KEY=VALUE: a torch._inductor.config"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    selection = select_speedups(args.speedups, package_version("rfdetr"), device_kind=device_kind)
    inductor = dict(args.inductor)
    with applied(selection, SimpleNamespace(loader_niceness=0)), inductor_config.patch(inductor):
        result = measure(
            args.resolution,
            args.batch,
            args.repeats,
            args.warmup,
            not args.no_compile,
            args.only,
            args.kernels,
            args.trace,
        )
    result["speedups"] = selection.names()
    result["inductor"] = inductor
    print(f"{result['measure']}, {args.batch} images at {args.resolution} px on {result['device']}:")
    for row in result["rows"]:
        print(f"  {row['ms']:9.2f}  {100 * row['share_of_parts_sum']:5.1f} %  {'  ' * row['depth']}{row['part']}")
    for label in result.get("parts_not_called", []):
        print(f"  {label}: not called as a module in this step (a speedup computes it inside its parent)")
    if result["parts_sum_ms"] is not None:
        print(f"  {result['parts_sum_ms']:9.2f}          the parts, timed apart")
    if result["whole_step_ms"] is not None:
        print(f"  {result['whole_step_ms']:9.2f}          the whole step")
    for label, kernels in result.get("kernels", {}).items():
        print(f"{label}, its costliest kernels (ms per step):")
        for kernel in kernels:
            print(f"  {kernel['ms']:8.3f}  {kernel['kernel']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

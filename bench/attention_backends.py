"""The attention kernels PyTorch can pick for RF-DETR Nano's attention shapes, timed forward and backward on this GPU.

usage: python -m bench.attention_backends [--batch 128] [--repeats 50] [--only SHAPE] [--out FILE.json]

RF-DETR Nano at 384 px calls `scaled_dot_product_attention` with three shapes per image batch B: the backbone's
windowed layers (9 calls of 4B x 6 heads x 145 tokens x 64), its global layers (3 calls of B x 6 x 580 x 64) and the
decoder's self-attention (2 calls; in training with group DETR's 13 query groups: 13B x 8 x 300 x 32). For each
shape, with PyTorch's own choice, with each backend it offers (`torch.nn.attention.SDPBackend`) and with FlexAttention
(`torch.nn.attention.flex_attention`, compiled: Inductor's Triton kernel for the shape) and with the attention written
out (`written_out_attention`, compiled: two batched products around one fused scale-softmax kernel, no fused
attention kernel at all, which can win where sequences are as short as the backbone's windows), this times the
forward and the backward pass in bf16 with CUDA events, and compares the output with the math backend's in float32.
Prints and writes one record per shape and backend; a backend that refuses a shape is reported with its error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any


def shapes(batch: int) -> dict[str, tuple[int, tuple[int, int, int, int]]]:
    """Name: (calls per forward pass, the query's shape), as RF-DETR Nano trains at 384 px."""
    return {
        "backbone_windowed": (9, (4 * batch, 6, 145, 64)),
        "backbone_global": (3, (batch, 6, 580, 64)),
        "decoder_self_attention": (2, (13 * batch, 8, 300, 32)),
    }


def written_out_attention(q: Any, k: Any, v: Any) -> Any:
    """softmax(q kᵀ / √d) v as two batched products, the softmax in float32 and its probabilities in the inputs'
    dtype, as SDPA's math backend computes it under bf16: the same function up to rounding."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return scores.float().softmax(-1).to(q.dtype) @ v


def time_backend(
    backend: Any, shape: tuple[int, ...], repeats: int, device: str = "cuda", compiled: bool = True
) -> dict[str, Any]:
    """Forward and backward ms of one attention call (`backend`: an SDPBackend, None for PyTorch's choice, "FLEX"
    or "WRITTEN_OUT"), after three warm-up calls, and its largest difference to float32 math. On the CPU (the tool's
    test) the times are wall-clock; `compiled=False` runs FlexAttention and the written-out attention eagerly."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_() for _ in range(3)
    )
    grad = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator)
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    if backend == "FLEX":
        from torch.nn.attention.flex_attention import flex_attention

        attention = flex_attention
    elif backend == "WRITTEN_OUT":
        attention = written_out_attention
    else:
        attention = F.scaled_dot_product_attention
    if backend in ("FLEX", "WRITTEN_OUT") and compiled:
        attention = torch.compile(attention, dynamic=False)
    clock = _Clock(device)
    try:
        with sdpa_kernel(backend) if backend not in (None, "FLEX", "WRITTEN_OUT") else contextlib.nullcontext():
            for _ in range(3):  # warm-up: kernel selection, autotuning, the compiles
                out = attention(q, k, v)
                out.backward(grad)
            clock.synchronize()
            forward_ms = backward_ms = 0.0
            for _ in range(repeats):
                clock.mark(0)
                out = attention(q, k, v)
                clock.mark(1)
                out.backward(grad)
                clock.mark(2)
                clock.synchronize()
                forward_ms += clock.ms(0, 1)
                backward_ms += clock.ms(1, 2)
    except Exception as error:  # a backend that refuses the shape (RuntimeError), or a compile that fails
        return {"error": str(error).splitlines()[0][:200]}
    return {
        "forward_ms": round(forward_ms / repeats, 4),
        "backward_ms": round(backward_ms / repeats, 4),
        "max_abs_difference_to_math": float((out.detach().float() - reference).abs().max()),
    }


class _Clock:
    """CUDA events on the GPU (GPU time between marks), the wall clock on the CPU."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device.startswith("cuda")
        self.synchronize = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if self.cuda else [0.0] * 3

    def mark(self, index: int) -> None:
        if self.cuda:
            self.events[index].record()
        else:
            self.events[index] = time.perf_counter()

    def ms(self, start: int, end: int) -> float:
        if self.cuda:
            return self.events[start].elapsed_time(self.events[end])
        return (self.events[end] - self.events[start]) * 1000


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--only", choices=list(shapes(1)), help="one shape (default: all three)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    backends = [
        None,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        "FLEX",
        "WRITTEN_OUT",
    ]
    records = []
    for name, (calls, shape) in shapes(args.batch).items():
        if args.only and name != args.only:
            continue
        for backend in backends:
            record = {
                "shape": name,
                "query": shape,
                "calls_per_step": calls,
                "backend": getattr(backend, "name", backend or "default"),
            }
            record |= time_backend(backend, shape, args.repeats)
            if "forward_ms" in record:
                record["ms_per_step"] = round(calls * (record["forward_ms"] + record["backward_ms"]), 3)
            records.append(record)
            print(json.dumps(record), flush=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

"""The attention kernels PyTorch can pick for RF-DETR Nano's attention shapes, timed forward and backward on this GPU.

usage: python -m bench.attention_backends [--batch 128] [--repeats 50] [--out FILE.json]

RF-DETR Nano at 384 px calls `scaled_dot_product_attention` with three shapes per image batch B: the backbone's
windowed layers (9 calls of 4B x 6 heads x 145 tokens x 64), its global layers (3 calls of B x 6 x 580 x 64) and the
decoder's self-attention (2 calls; in training with group DETR's 13 query groups: 13B x 8 x 300 x 32). For each
shape, with PyTorch's own choice, with each backend it offers (`torch.nn.attention.SDPBackend`) and with FlexAttention
(`torch.nn.attention.flex_attention`, compiled: Inductor's Triton kernel for the shape), this times the
forward and the backward pass in bf16 with CUDA events, and compares the output with the math backend's in float32.
Prints and writes one record per shape and backend; a backend that refuses a shape is reported with its error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any


def shapes(batch: int) -> dict[str, tuple[int, tuple[int, int, int, int]]]:
    """Name: (calls per forward pass, the query's shape), as RF-DETR Nano trains at 384 px."""
    return {
        "backbone_windowed": (9, (4 * batch, 6, 145, 64)),
        "backbone_global": (3, (batch, 6, 580, 64)),
        "decoder_self_attention": (2, (13 * batch, 8, 300, 32)),
    }


def time_backend(backend: Any, shape: tuple[int, ...], repeats: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator).requires_grad_() for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    if backend == "FLEX":
        from torch.nn.attention.flex_attention import flex_attention

        attention = torch.compile(flex_attention, dynamic=False)
    else:
        attention = F.scaled_dot_product_attention
    try:
        with sdpa_kernel(backend) if backend not in (None, "FLEX") else contextlib.nullcontext():
            for _ in range(3):  # warm-up: kernel selection, autotuning, FlexAttention's compile
                out = attention(q, k, v)
                out.backward(grad)
            torch.cuda.synchronize()
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            forward_ms = backward_ms = 0.0
            for _ in range(repeats):
                events[0].record()
                out = attention(q, k, v)
                events[1].record()
                out.backward(grad)
                events[2].record()
                torch.cuda.synchronize()
                forward_ms += events[0].elapsed_time(events[1])
                backward_ms += events[1].elapsed_time(events[2])
    except Exception as error:  # a backend that refuses the shape (RuntimeError), or FlexAttention's compile
        return {"error": str(error).splitlines()[0][:200]}
    return {
        "forward_ms": round(forward_ms / repeats, 4),
        "backward_ms": round(backward_ms / repeats, 4),
        "max_abs_difference_to_math": float((out.float() - reference).abs().max()),
    }


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    backends = [None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, "FLEX"]
    records = []
    for name, (calls, shape) in shapes(args.batch).items():
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

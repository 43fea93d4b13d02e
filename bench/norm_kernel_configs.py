"""The one-pass kernel of `backbone_norm_backward_in_one_pass` at each tile, warps and programs a multiprocessor:
its microseconds a call and the bandwidth that makes, and how far its outputs are from the shipped configuration's.

usage: python -m bench.norm_kernel_configs [--rows 74240] [--channels 384] [--tiles 1,2,4,8,16] [--warps 2,4,8]
           [--per-multiprocessor 1,2,4,8] [--out FILE.json]

Tiles are powers of two (Triton's ranges are).

Calls the lever's custom op (`residual_norm_backward`, the kernel and the sum of its partial sums) on random inputs
of the dtypes a bf16 step gives it (the residual sum and its gradient in float32, the attention's or MLP's output and
the norm's output gradient in bf16) with the lever's TILE, WARPS and PROGRAMS_PER_MULTIPROCESSOR set to each
combination in turn. On the GPU each call is timed by Triton's `do_bench`; on the CPU (Triton's interpreter, with
TRITON_INTERPRET=1) by the clock, which only shows that the tool runs. The default rows are those of 128 images at
384 px (four windows of 12 x 12 patches and a class token each). `apart` is each configuration's largest
difference from the shipped configuration's outputs over the op's three outputs (x's and a's gradients, the
parameters'), relative to that output's largest value: the configurations sum in other orders, so a bf16 output can
round the other way (2^-8 of a value).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


def numbers(value: str) -> list[int]:
    return [int(item) for item in value.split(",")]


def inputs(rows: int, channels: int, device: torch.device) -> tuple[Tensor, ...]:
    """grad_z, grad_h, h, a, mean, rstd, scale, weight as a bf16 step hands them to the op."""
    generator = torch.Generator(device=device).manual_seed(0)

    def random(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    h, weight, scale = random(rows, channels), random(channels), random(channels)
    _, mean, rstd = torch.native_layer_norm(h, (channels,), weight, None, 1e-6)
    grad_z, grad_h = random(rows, channels, dtype=torch.bfloat16), random(rows, channels)
    return grad_z, grad_h, h, random(rows, channels, dtype=torch.bfloat16), mean, rstd, scale, weight


def microseconds(work: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(work) * 1000
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1e6


def measure(
    rows: int, channels: int, tiles: list[int], warps: list[int], per_multiprocessor: list[int]
) -> dict[str, Any]:
    """One record per configuration, fastest first, and the shipped configuration."""
    from rfdetr_coco_pipeline.hooks.patches import backbone_norm_backward_in_one_pass as lever

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args = inputs(rows, channels, device)
    moved = sum(t.numel() * t.element_size() for t in args[:4]) + rows * channels * (4 + 2)  # grad_x and grad_a
    shipped = (lever.TILE, lever.WARPS, lever.PROGRAMS_PER_MULTIPROCESSOR)

    def run() -> tuple[Tensor, ...]:
        return lever.residual_norm_backward(*args)

    reference = [output.float() for output in run()]
    records = []
    try:
        for tile, warp_count, programs in itertools.product(tiles, warps, per_multiprocessor):
            lever.TILE, lever.WARPS, lever.PROGRAMS_PER_MULTIPROCESSOR = tile, warp_count, programs
            apart = max(
                float((mine.float() - theirs).abs().max() / theirs.abs().max())
                for mine, theirs in zip(run(), reference, strict=True)
            )
            us = microseconds(run, device)
            records.append(
                {
                    "tile": tile,
                    "warps": warp_count,
                    "programs_per_multiprocessor": programs,
                    "us": round(us, 1),
                    "gb_per_s": round(moved / us / 1e3, 1),
                    "apart": apart,
                }
            )
    finally:
        lever.TILE, lever.WARPS, lever.PROGRAMS_PER_MULTIPROCESSOR = shipped
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "rows": rows,
        "channels": channels,
        "bytes_moved": moved,
        "shipped": dict(zip(("tile", "warps", "programs_per_multiprocessor"), shipped, strict=True)),
        "configurations": sorted(records, key=lambda record: record["us"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=128 * 4 * (12 * 12 + 1))
    parser.add_argument("--channels", type=int, default=384)
    parser.add_argument("--tiles", type=numbers, default=[1, 2, 4, 8, 16])
    parser.add_argument("--warps", type=numbers, default=[2, 4, 8])
    parser.add_argument("--per-multiprocessor", type=numbers, default=[1, 2, 4, 8])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = measure(args.rows, args.channels, args.tiles, args.warps, args.per_multiprocessor)
    print(f"{result['rows']} rows of {result['channels']} on {result['device']}, shipped: {result['shipped']}")
    for record in result["configurations"]:
        print(
            f"  tile {record['tile']:2d}  warps {record['warps']}"
            f"  per multiprocessor {record['programs_per_multiprocessor']}"
            f"  {record['us']:9.1f} us  {record['gb_per_s']:7.1f} GB/s  apart {record['apart']:.1e}"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

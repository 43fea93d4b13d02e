"""The Triton product of `decoder_relu_mask_in_the_product` (`feed_forward_products.masked_product`) at each tile,
warps and stages, against what it replaces (cuBLAS's product, then ReLU's mask as a pass of its own): microseconds a
call, the product's TFLOPS, and how far each configuration's output is from the shipped one's.

usage: python -m bench.product_kernel_configs [--tiles 128x128x64,128x256x64,...] [--warps 4,8] [--stages 3,4]
           [--saved-first 0,1] [--rows N] [--inner K] [--columns N] [--dtype bfloat16|float32] [--out FILE.json]

The shape defaults to Nano's at 128 images of 384 px: the decoder's 499,200 query rows (3,900 a image), from the
256-wide gradient to the 2,048-wide hidden one; `--rows`, `--inner` and `--columns` change it. Tiles are BLOCK_M x
BLOCK_N x BLOCK_K, powers of two (Triton's ranges are); `--saved-first 1` reads the saved activation's tile before the
product's loop, 0 after it.

On the GPU each call is timed by Triton's `do_bench`; on the CPU (Triton's interpreter, with TRITON_INTERPRET=1) by
the clock, which only shows that the tool runs. A configuration Triton cannot build (too much shared memory) is kept
with its error. `apart` is a configuration's largest difference from the shipped configuration's output relative to
that output's largest value: the configurations sum in other orders, so a bf16 output can round the other way.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench.norm_kernel_configs import microseconds, numbers

FIELDS = ("block_m", "block_n", "block_k", "warps", "stages", "saved_first")
# rows, inner, columns of the decoder's feed-forward backward product at 128 images of 384 px
NANO_SHAPE = (128 * 3900, 256, 2048)


def tiles(value: str) -> list[tuple[int, int, int]]:
    return [tuple(int(side) for side in tile.split("x")) for tile in value.split(",")]  # type: ignore[misc]


def inputs(shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> tuple:
    """a (rows, inner): the output's gradient; b (inner, columns): the second product's weight as the backward
    reads it; saved (rows, columns): ReLU's output."""
    rows, inner, columns = shape
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(rows, inner, generator=generator, device=device).to(dtype)
    b = (torch.randn(inner, columns, generator=generator, device=device) / inner**0.5).to(dtype)
    saved = torch.randn(rows, columns, generator=generator, device=device)
    return a, b, torch.relu(saved).to(dtype)


def replaced(a: Tensor, b: Tensor, saved: Tensor) -> Tensor:
    """What the kernel replaces: cuBLAS's product, then ReLU's mask in a pass of its own."""
    return (a @ b) * (saved > 0)


def measure(
    shape: tuple[int, int, int],
    tile_list: list[tuple[int, int, int]],
    warps: list[int],
    stages: list[int],
    saved_first: list[int],
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The replaced pair's time and one record per configuration, fastest first."""
    from rfdetr_coco_pipeline.hooks.patches import feed_forward_products as products

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    a, b, saved = inputs(shape, dtype, device)
    flop = 2 * shape[0] * shape[1] * shape[2]
    names = ("TILE_M", "TILE_N", "TILE_K", "WARPS", "STAGES", "SAVED_FIRST")
    shipped = tuple(getattr(products, name) for name in names)

    def run() -> Tensor:
        return products.masked_product(a, b, saved)

    reference = run().float()
    records = []
    try:
        for tile, warp_count, stage_count, first in itertools.product(tile_list, warps, stages, saved_first):
            configuration = (*tile, warp_count, stage_count, bool(first))
            for name, value in zip(names, configuration, strict=True):
                setattr(products, name, value)
            record: dict[str, Any] = dict(zip(FIELDS, configuration, strict=True))
            try:
                found = run().float()
                record["apart"] = float((found - reference).abs().max() / reference.abs().max())
                us = microseconds(run, device)
                record |= {"us": round(us, 1), "tflops": round(flop / us / 1e6, 1)}
            except Exception as error:  # a configuration Triton cannot build on this GPU
                record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            records.append(record)
    finally:
        for name, value in zip(names, shipped, strict=True):
            setattr(products, name, value)
    replaced_us = microseconds(lambda: replaced(a, b, saved), device)
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "rows": shape[0],
        "inner": shape[1],
        "columns": shape[2],
        "shipped": dict(zip(FIELDS, shipped, strict=True)),
        "replaced_us": round(replaced_us, 1),
        "configurations": sorted(records, key=lambda record: record.get("us", float("inf"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiles", type=tiles, default=tiles("128x128x64,128x256x64,256x128x64,64x256x64,128x128x32"))
    parser.add_argument("--warps", type=numbers, default=[4, 8])
    parser.add_argument("--stages", type=numbers, default=[3, 4])
    parser.add_argument("--saved-first", type=numbers, default=[0, 1])
    parser.add_argument("--rows", type=int)
    parser.add_argument("--inner", type=int)
    parser.add_argument("--columns", type=int)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shape = (args.rows or NANO_SHAPE[0], args.inner or NANO_SHAPE[1], args.columns or NANO_SHAPE[2])
    result = measure(shape, args.tiles, args.warps, args.stages, args.saved_first, getattr(torch, args.dtype))
    print(
        f"({result['rows']} x {result['inner']}) @ ({result['inner']} x {result['columns']}) on {result['device']}; "
        f"cuBLAS and the mask's pass: {result['replaced_us']:.1f} us; shipped: {result['shipped']}"
    )
    for record in result["configurations"]:
        tile = f"{record['block_m']}x{record['block_n']}x{record['block_k']}"
        label = f"{tile:11s} warps {record['warps']} stages {record['stages']}"
        label += " saved first" if record["saved_first"] else " saved after"
        if "error" in record:
            print(f"  {label}  {record['error']}")
            continue
        print(f"  {label}  {record['us']:9.1f} us  {record['tflops']:6.1f} TFLOPS  apart {record['apart']:.1e}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

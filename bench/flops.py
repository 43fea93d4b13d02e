"""FLOPs of one training image of the recipe as trained, counted by torch, and the GPU utilisation of a measured rate.

usage: python -m bench.flops [--resolution 384] [--batch 2] [--rate IMAGES_PER_S] [--peak-tflops 989]
           [--out FILE.json]

Builds rfdetr's Nano training module (random initialisation, rfdetr's Nano configuration: 13 decoder groups in
training) and runs one training step's work on synthetic images and boxes under torch's `FlopCounterMode`: the
forward, the loss with its Hungarian matching, and the backward. FlopCounterMode counts the matrix work
(matmul, convolution, attention, their gradients); element-wise work, the deformable sampling (`grid_sample`) and the
optimizer are not counted, so the count is a floor of the work and the utilisation it gives is the matrix-work
utilisation. A FLOP is one multiply or one add (a multiply-add is 2), as GPU peak figures count them. The count does
not depend on the device or on the image's content, so it runs on the CPU.

Prints the FLOPs per training image, the forward's split by model part (PARTS), and, given `--rate`
(training images/s), the TFLOP/s that rate means and its share of `--peak-tflops` (the H200's dense bf16 peak by
default).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

H200_DENSE_BF16_TFLOPS = 989.0


def synthetic_batch(batch: int, resolution: int, boxes_per_image: int = 7) -> tuple[Any, list[dict[str, Any]]]:
    """`batch` random images and targets shaped as rfdetr's loader yields them (a NestedTensor; boxes as normalised
    cx, cy, w, h). Seven boxes an image is COCO's mean."""
    from rfdetr.utilities.tensors import NestedTensor

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, resolution, resolution, generator=generator)
    mask = torch.zeros(batch, resolution, resolution, dtype=torch.bool)
    targets = []
    for _ in range(batch):
        centres = torch.rand(boxes_per_image, 2, generator=generator) * 0.6 + 0.2
        sizes = torch.rand(boxes_per_image, 2, generator=generator) * 0.3 + 0.05
        targets.append(
            {
                "labels": torch.randint(1, 91, (boxes_per_image,), generator=generator),
                "boxes": torch.cat([centres, sizes], dim=1),
                "image_id": torch.tensor(0),
                "orig_size": torch.tensor([resolution, resolution]),
                "size": torch.tensor([resolution, resolution]),
            }
        )
    return NestedTensor(images, mask), targets


def training_module(resolution: int, batch: int, **model: Any) -> Any:
    """rfdetr's Lightning module for Nano as the recipe trains it (no pretrained weights), in training mode
    (`model`: further Nano settings, as a CPU tool's smaller `num_queries`)."""
    from rfdetr import RFDETRNano
    from rfdetr.training import RFDETRModelModule

    torch.manual_seed(0)
    detector = RFDETRNano(pretrain_weights=None, resolution=resolution, device="cpu", **model)
    train_config = detector.get_train_config(dataset_dir=".", batch_size=batch, epochs=1, tensorboard=False)
    module = RFDETRModelModule(detector.model_config, train_config)
    return module.train()


# The model's parts, by module path (rfdetr 1.11.2's names for Nano; numbers stand for any index). A module path no
# pattern matches is counted under "other".
PARTS = {
    "backbone blocks (patch embedding, 12 windowed blocks)": r"LWDETR\.backbone\.N\.encoder$",
    "projector": r"LWDETR\.backbone\.N\.projector$",
    "decoder self-attention": r"LWDETR\.transformer\.decoder\.layers\.N\.self_attn$",
    "deformable cross-attention (its projections)": r"LWDETR\.transformer\.decoder\.layers\.N\.cross_attn$",
    "decoder FFNs": r"LWDETR\.transformer\.decoder\.layers\.N\.linear[12]$",
    "reference point head": r"LWDETR\.transformer\.decoder\.ref_point_head$",
    "heads (class, box, two-stage proposals)": r"LWDETR\.(class_embed|bbox_embed|transformer\.enc_\w+\.N)$",
}


def _flops_by_module(counter: FlopCounterMode) -> dict[str, int]:
    """FLOPs per module path, indices of module lists replaced by N and summed (13 groups' heads are one entry)."""
    summed: dict[str, int] = {}
    for name, ops in counter.get_flop_counts().items():
        general = re.sub(r"\.\d+", ".N", name)
        summed[general] = summed.get(general, 0) + int(sum(ops.values()))
    return summed


def count_training_step(resolution: int, batch: int) -> tuple[int, int, dict[str, int]]:
    """FLOPs of one training step on `batch` images: the whole step (forward, loss with matching, backward), the
    forward alone, and the forward's split into PARTS. The split is the forward's because FlopCounterMode books a
    module's backward under every module whose backward is still open; a part's backward costs about twice its
    forward, so the forward's shares are the step's."""
    module = training_module(resolution, batch)
    samples, targets = synthetic_batch(batch, resolution)
    forward = FlopCounterMode(display=False, depth=None)
    with forward:
        outputs = module.model(samples, targets)
    whole = FlopCounterMode(display=False)
    with whole:
        outputs = module.model(samples, targets)
        losses = module.criterion(outputs, targets)
        weights = module.criterion.weight_dict
        loss = torch.stack([losses[k] * weights[k] for k in losses if k in weights]).sum()
        loss.backward()
    by_module = _flops_by_module(forward)
    split = {part: sum(f for name, f in by_module.items() if re.fullmatch(p, name)) for part, p in PARTS.items()}
    split["other"] = forward.get_total_flops() - sum(split.values())
    return int(whole.get_total_flops()), int(forward.get_total_flops()), split


def report(resolution: int, batch: int, rate: float | None, peak_tflops: float) -> dict[str, Any]:
    """The count as a record: GFLOP per training image, the forward's, its split by part, and the utilisation of
    `rate` (images/s) against `peak_tflops` when a rate is given."""
    step, forward, split = count_training_step(resolution, batch)
    per_image = step / batch
    result: dict[str, Any] = {
        "resolution": resolution,
        "batch": batch,
        "gflop_per_training_image": round(per_image / 1e9, 3),
        "forward_gflop_per_image": round(forward / batch / 1e9, 3),
        "forward_gflop_per_image_by_part": {part: round(f / batch / 1e9, 3) for part, f in split.items()},
        "counted": "matrix work (FlopCounterMode): no element-wise work, grid_sample or optimizer",
    }
    if rate is not None:
        achieved = per_image * rate / 1e12
        result.update(
            rate_images_per_s=rate,
            achieved_tflops=round(achieved, 1),
            peak_tflops=peak_tflops,
            utilisation=round(achieved / peak_tflops, 4),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolution", type=int, default=384)
    parser.add_argument("--batch", type=int, default=2, help="images counted at once (the count is per image)")
    parser.add_argument("--rate", type=float, help="a measured training rate, images/s")
    parser.add_argument("--peak-tflops", type=float, default=H200_DENSE_BF16_TFLOPS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = report(args.resolution, args.batch, args.rate, args.peak_tflops)
    step = result["gflop_per_training_image"]
    print(f"{step:.1f} GFLOP per training image ({args.resolution} px; forward, loss and backward)")
    forward = result["forward_gflop_per_image"]
    print(f"{forward:.1f} GFLOP of it in the forward, by part:")
    for part, gflop in result["forward_gflop_per_image_by_part"].items():
        print(f"  {gflop:8.2f}  {100 * gflop / forward:5.1f} %  {part}")
    if args.rate is not None:
        print(
            f"at {args.rate:g} images/s: {result['achieved_tflops']} TFLOP/s, "
            f"{100 * result['utilisation']:.1f} % of {args.peak_tflops:g} TFLOP/s"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

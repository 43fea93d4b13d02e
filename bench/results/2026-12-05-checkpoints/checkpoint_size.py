"""The size of a last.ckpt the train stage wrote and the tensors in it (what the training thread copies to the host
under checkpoints_in_background). Run after cpu-run.sh:
`python bench/results/2026-12-05-checkpoints/checkpoint_size.py /tmp/ckb/out/with1/results/train/state/*/last.ckpt`;
output in checkpoint-size.txt."""

import sys
from pathlib import Path

import torch
from lightning_utilities.core.apply_func import apply_to_collection

path = Path(sys.argv[1])
tensors: list[torch.Tensor] = []
apply_to_collection(torch.load(path, map_location="cpu", weights_only=False), torch.Tensor, tensors.append)
print(f"{path.name}: {path.stat().st_size:,} bytes, {len(tensors):,} tensors")

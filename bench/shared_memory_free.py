"""How long the training process holds up when it frees a batch that a DataLoader worker sent through shared
memory, for a batch of float32 images (what rfdetr's workers send) and of uint8 ones (the images_as_bytes speedup).

usage: python -m bench.shared_memory_free [--batch 128] [--resolution 384] [--batches 12]

Freeing happens while Python's interpreter lock is held, so the training thread can run nothing else meanwhile.
Prints the milliseconds each `del` took, per dtype. Runs on the CPU; no GPU needed.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class RandomBatches(Dataset):
    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, batches: int) -> None:
        self.shape, self.dtype, self.batches = shape, dtype, batches

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, index: int) -> torch.Tensor:
        return (torch.rand(self.shape) * 255).to(self.dtype)


def free_times_ms(dtype: torch.dtype, shape: tuple[int, ...], batches: int) -> list[float]:
    times = []
    for batch in DataLoader(RandomBatches(shape, dtype, batches), batch_size=None, num_workers=2):
        batch.sum()  # touch every page, as the copy to pinned memory does
        start = time.perf_counter()
        del batch
        times.append(round((time.perf_counter() - start) * 1000, 1))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--resolution", type=int, default=384)
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    shape = (args.batch, 3, args.resolution, args.resolution)
    for dtype in (torch.float32, torch.uint8):
        print(f"{dtype}: {free_times_ms(dtype, shape, args.batches)} ms", flush=True)


if __name__ == "__main__":
    main()

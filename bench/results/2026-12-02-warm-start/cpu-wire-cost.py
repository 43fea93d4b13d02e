"""What a validation batch (125 images x 300 detections) costs the training process to send to
`matching_in_workers`' pool: pickled as torch tensors (what the speedup sends) against an idea tried and not kept,
numpy arrays (`wire_copies` below), conversion included. The tensors are held as `metric_inputs_in_one_copy`
leaves a GPU batch on the host: views of one buffer per dtype. Milliseconds per batch, the best of 5 rounds of 10.
usage: PYTHONPATH=. python bench/results/2026-12-02-warm-start/cpu-wire-cost.py
"""

import json
import os
import time
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (its tensor reducers, as in the training process)

from bench.synth_detections import validation_batch


def wire_copies(items):
    """The idea measured: each tensor as a numpy array (bfloat16 as its 16-bit words) and its dtype's name."""
    wire = []
    for item in items:
        arrays = {}
        for key, tensor in item.items():
            raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
            arrays[key] = (raw.contiguous().numpy(), str(tensor.dtype).removeprefix("torch."))
        wire.append(arrays)
    return wire


def from_wire(items):
    return [{k: torch.from_numpy(a).view(getattr(torch, d)) for k, (a, d) in item.items()} for item in items]


def views_of_one_copy(items):
    by_dtype: dict = {}
    for index, item in enumerate(items):
        for key, value in item.items():
            by_dtype.setdefault(value.dtype, []).append((index, key, value))
    moved = [dict(item) for item in items]
    for entries in by_dtype.values():
        flat = torch.cat([value.reshape(-1) for _, _, value in entries])
        for (index, key, value), piece in zip(entries, flat.split([v.numel() for _, _, v in entries]), strict=True):
            moved[index][key] = piece.view(value.shape)
    return moved


def best_ms(send) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10):
            send()
        rounds.append((time.perf_counter() - start) / 10 * 1e3)
    return round(min(rounds), 2)


torch.set_num_threads(1)
preds, targets = (views_of_one_copy(items) for items in validation_batch(torch.Generator().manual_seed(0)))
received = from_wire(ForkingPickler.loads(ForkingPickler.dumps(wire_copies(preds))))
same = all(torch.equal(after[k], before[k]) for before, after in zip(preds, received, strict=True) for k in before)
print(
    json.dumps(
        {
            "cpus": len(os.sched_getaffinity(0)),
            "tensors_ms_per_batch": best_ms(lambda: ForkingPickler.dumps((preds, targets))),
            "wire_copies_ms_per_batch": best_ms(
                lambda: ForkingPickler.dumps((wire_copies(preds), wire_copies(targets)))
            ),
            "same_tensors_after_the_trip": same,
        },
        indent=1,
    )
)

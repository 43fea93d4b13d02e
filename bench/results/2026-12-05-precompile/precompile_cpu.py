"""Does torch's experimental `caching_precompile` let a new process skip Dynamo's tracing of RF-DETR Nano's model?

One process per call: RF-DETR Nano (resolution 64, from scratch, seed 0) compiled as rfdetr compiles it
(`torch.compile(model)`, Inductor), one training forward and backward on a fixed batch of two images, on the CPU.
Prints, as JSON: the first step's seconds, Dynamo's own compile seconds (`torch._dynamo.utils.compile_times`), the
loss and a checksum of the gradients. With `--precompile` the process sets `caching_precompile` (and AOTAutograd's
cache it needs); with `--save` it saves the compile artifacts (`torch.compiler.save_cache_artifacts`, which writes
the Dynamo cache) after the step. Run it with one TORCHINDUCTOR_CACHE_DIR for all calls (`run.sh`)."""

from __future__ import annotations

import argparse
import json
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--precompile", action="store_true")
parser.add_argument("--save", action="store_true")
args = parser.parse_args()
if args.precompile:
    torch._dynamo.config.caching_precompile = True
    torch._functorch.config.enable_autograd_cache = True

from rfdetr import RFDETRNano  # noqa: E402
from rfdetr.utilities.tensors import NestedTensor  # noqa: E402

torch.manual_seed(0)
model = RFDETRNano(pretrain_weights=None, resolution=64).model.model
model.train()
compiled = torch.compile(model)
generator = torch.Generator().manual_seed(1)
images = NestedTensor(torch.rand(2, 3, 64, 64, generator=generator), torch.zeros(2, 64, 64, dtype=torch.bool))

started = time.perf_counter()
out = compiled(images)
heads = [out, *out.get("aux_outputs", []), *([out["enc_outputs"]] if "enc_outputs" in out else [])]
loss = sum(head["pred_logits"].float().square().mean() + head["pred_boxes"].float().mean() for head in heads)
loss.backward()
first_step = time.perf_counter() - started
gradients = sum(p.grad.double().abs().sum().item() for p in model.parameters() if p.grad is not None)
if args.save:
    torch.compiler.save_cache_artifacts()
from torch._dynamo.utils import compile_times  # noqa: E402

print(
    json.dumps(
        {
            "precompile": args.precompile,
            "first_step_seconds": round(first_step, 2),
            "dynamo_compile_times": compile_times(repr="str", aggregate=True)[:2000],
            "loss": loss.item(),
            "gradient_abs_sum": gradients,
        }
    )
)

"""Which of RF-DETR Nano's parameters get a gradient whose strides differ from the parameter's (the layout DDP's
"Grad strides do not match bucket view strides" warning is about), in one eager backward pass on the CPU at 384 px.
Run with `python bench/results/2026-12-05-grad-strides/grad_strides.py`; output in grad_strides.txt."""

import torch
from rfdetr import RFDETRNano
from rfdetr.utilities.tensors import NestedTensor

torch.manual_seed(0)
model = RFDETRNano(pretrain_weights=None, resolution=384).model.model
model.train()
transposed: list[tuple[str, tuple[int, ...]]] = []
for name, parameter in model.named_parameters():

    def note(gradient: torch.Tensor, name: str = name, parameter: torch.Tensor = parameter) -> None:
        if gradient.stride() != parameter.stride():
            transposed.append((name, tuple(parameter.shape)))

    parameter.register_hook(note)
out = model(NestedTensor(torch.randn(2, 3, 384, 384), torch.zeros(2, 384, 384, dtype=torch.bool)))
heads = [out, *out.get("aux_outputs", []), *([out["enc_outputs"]] if "enc_outputs" in out else [])]
sum(head["pred_logits"].float().sum() + head["pred_boxes"].float().sum() for head in heads).backward()
values = sum(torch.Size(shape).numel() for _, shape in transposed)
print(f"{len(transposed)} parameters, {values:,} values ({values * 4 / 1e6:.1f} MB in fp32)")
for family in sorted({name.split(".")[1] for name, _ in transposed}):
    print(family, sum(1 for name, _ in transposed if name.split(".")[1] == family))

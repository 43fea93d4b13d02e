"""The lr_log_on_device speedup: rfdetr's learning rates are logged with the same names, settings and values."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rfdetr_coco_pipeline.hooks.patches.lr_log_on_device import log_on_device, lr_log_on_device


def logged_by(log_learning_rates, lrs: list[float]) -> list[tuple[str, torch.Tensor, dict]]:
    """What `_log_learning_rates` hands to Lightning's `self.log`, as Lightning stores it (a tensor)."""
    calls = []

    def log(name, value, **settings):
        # LightningModule.log: a number becomes torch.tensor(value, default dtype), a tensor is cloned
        stored = value.clone() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
        calls.append((name, stored, settings))

    module = SimpleNamespace(log=log, device=torch.device("cpu"))
    optimizer = SimpleNamespace(param_groups=[{"lr": lr} for lr in lrs] + [{"momentum": 0.9}])
    log_learning_rates(module, optimizer)
    return calls


def test_the_same_values_names_and_settings_reach_lightning():
    from rfdetr.training.module_model import RFDETRModelModule

    original = RFDETRModelModule._log_learning_rates
    lrs = [1e-4 * 0.37, 1.5e-4 * 0.37, 3.3333e-5]
    theirs, ours = logged_by(original, lrs), logged_by(log_on_device(original), lrs)
    assert [name for name, _, _ in ours] == ["train/lr", "train/lr_min", "train/lr_max"]
    assert [(n, s) for n, _, s in ours] == [(n, s) for n, _, s in theirs]
    assert all(
        mine.dtype == their.dtype and torch.equal(mine, their)
        for (_, mine, _), (_, their, _) in zip(ours, theirs, strict=True)
    )
    assert logged_by(log_on_device(original), []) == []  # no learning rate, nothing logged, as in rfdetr


def test_the_method_is_replaced_inside_the_block_only():
    from rfdetr.training.module_model import RFDETRModelModule

    original = RFDETRModelModule._log_learning_rates
    with lr_log_on_device():
        assert RFDETRModelModule._log_learning_rates is not original
    assert RFDETRModelModule._log_learning_rates is original

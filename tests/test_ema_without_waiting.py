"""The ema_without_waiting speedup: rfdetr's EMA weights and counter are the same without the host's waits."""

from __future__ import annotations

import copy

import torch

from rfdetr_coco_pipeline.hooks.patches import ema_without_waiting as extension


class Tiny(torch.nn.Module):
    """Weights and an integer buffer, like a detector with a step counter."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.norm = torch.nn.LayerNorm(3)
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    @property
    def device(self) -> torch.device:
        return self.linear.weight.device


def train_with_ema(steps: list[int], with_extension: bool, restore: dict[int, dict] | None = None):
    """rfdetr's EMA callback over training steps `steps` (global step numbers); the weights change every step.
    `restore` maps a step to an averaged-model state loaded just before it (a resumed checkpoint)."""
    from rfdetr.training.callbacks.ema import RFDETREMACallback

    torch.manual_seed(0)
    model = Tiny()
    callback = RFDETREMACallback(decay=0.9, tau=3)
    callback.on_fit_start(None, model)
    for step in steps:
        if restore and step in restore:
            callback._average_model.load_state_dict(restore[step])
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
            model.seen += 1
        if with_extension:
            with extension.ema_without_waiting():
                callback._update_ema_for_step(model, step)
        else:
            callback._update_ema_for_step(model, step)
    return callback._average_model


def assert_same_average(ours, theirs):
    mine, rfdetr_s = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == rfdetr_s.keys()
    for key in mine:
        assert mine[key].dtype == rfdetr_s[key].dtype and torch.equal(mine[key], rfdetr_s[key]), key


def test_the_ema_weights_and_counter_equal_rfdetrs_over_many_steps():
    steps = list(range(1, 9))
    ours, theirs = train_with_ema(steps, True), train_with_ema(steps, False)
    assert int(theirs.n_averaged) == len(steps)
    assert_same_average(ours, theirs)


def test_a_counter_restored_between_updates_is_read_again():
    checkpoint = copy.deepcopy(train_with_ema([1, 2, 3], False).state_dict())  # after 3 updates
    steps = [1, 2, 3, 4, 5, 9, 10]  # 5 updates, then a restore to the 3-update checkpoint before step 9
    ours = train_with_ema(steps, True, {9: checkpoint})
    theirs = train_with_ema(steps, False, {9: checkpoint})
    assert int(theirs.n_averaged) == 3 + 2
    assert_same_average(ours, theirs)

"""The progress bar shows the run's own values without waiting for the GPU: on the CPU Lightning's values, on the
GPU the newest that reached the host, while Lightning's own conversion would have waited every step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rfdetr_coco_pipeline.hooks.patches.progress_bar_without_waiting import progress_bar_without_waiting
from tests.helpers.lightning_trainer import small_trainer


def fit_and_watch_the_bar(root: Path, device: str, steps: int, sleep_cycles: int = 0, strict_from: int | None = None):
    """Two epochs of a small model that logs a loss and a learning rate to the progress bar at every step (as rfdetr
    does) and the loss's epoch mean. Returns what the bar showed after each step, what it showed when training
    ended (with the last epoch's mean), and every step's logged values. On the GPU each step also keeps the GPU busy for
    `sleep_cycles`, and from step `strict_from` on anything that waits for the GPU raises (torch's sync debug mode)."""
    import pytorch_lightning as pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.logged: list[dict[str, float]] = []

        def training_step(self, batch, batch_idx):
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            loss = self.layer(batch[0]).square().mean()
            lr = torch.full((), 0.1 / (1 + self.global_step), device=self.device)
            self.log("loss", loss, prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/lr", lr, prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/loss", loss, prog_bar=True, on_step=False, on_epoch=True)
            self.logged.append({"loss": loss.detach(), "train/lr": lr})
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            generator = torch.Generator().manual_seed(0)
            data = torch.utils.data.TensorDataset(torch.randn(steps * 4, 8, generator=generator))
            return torch.utils.data.DataLoader(data, batch_size=4)

    class Watch(pl.Callback):
        def __init__(self) -> None:
            self.after_step: list[dict[str, float]] = []
            self.after_epoch: list[dict[str, float]] = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if strict_from is not None and trainer.global_step >= strict_from:
                torch.cuda.set_sync_debug_mode("error")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            # what a progress bar reads: Lightning converts the values for it here (it does again after this hook)
            self.after_step.append(dict(trainer.progress_bar_metrics))

        def on_train_epoch_end(self, trainer, module) -> None:
            if strict_from is not None:  # Lightning's epoch-end conversion waits, as it should, once an epoch
                torch.cuda.set_sync_debug_mode(0)

        def on_train_end(self, trainer, module) -> None:
            self.after_epoch.append(dict(trainer.progress_bar_metrics))

    torch.manual_seed(0)
    model, watch = Model(), Watch()
    trainer = small_trainer(root, [watch], max_epochs=2, accelerator=device)
    try:
        trainer.fit(model)
    finally:
        if strict_from is not None:
            torch.cuda.set_sync_debug_mode(0)
    logged = [{name: float(value) for name, value in values.items()} for values in model.logged]
    return watch.after_step, watch.after_epoch, logged


def test_on_the_cpu_the_bar_shows_lightnings_values(tmp_path):
    stock = fit_and_watch_the_bar(tmp_path / "stock", "cpu", steps=5)
    from pytorch_lightning.trainer.connectors.logger_connector import result

    with progress_bar_without_waiting():
        ours = fit_and_watch_the_bar(tmp_path / "ours", "cpu", steps=5)
        shown = result._ResultCollection.metrics.shown.shown  # what went through the speedup
    after_step, after_epoch, logged = ours
    assert shown == {"loss": logged[-1]["loss"], "train/lr": logged[-1]["train/lr"]}
    assert ours == stock
    assert len(after_step) == len(logged) == 10
    # each step's bar shows that step's values, as Python numbers
    for shown, values in zip(after_step, logged, strict=True):
        assert all(type(shown[name]) is float for name in ("loss", "train/lr"))
        assert shown["loss"] == pytest.approx(values["loss"]) and shown["train/lr"] == pytest.approx(values["train/lr"])
    second_epoch = [values["loss"] for values in logged[5:]]
    assert after_epoch[-1]["train/loss"] == pytest.approx(sum(second_epoch) / len(second_epoch))


def test_lightnings_conversion_is_back_after_the_block():
    from pytorch_lightning.trainer.connectors.logger_connector import result

    convert, metrics = result.convert_tensors_to_scalars, result._ResultCollection.metrics
    with progress_bar_without_waiting():
        assert result.convert_tensors_to_scalars is not convert and result._ResultCollection.metrics is not metrics
    assert result.convert_tensors_to_scalars is convert and result._ResultCollection.metrics is metrics


GPU_BUSY_CYCLES = 50_000_000  # about 25-50 ms of GPU time a step: a step's values are still on their way at its end


@pytest.mark.gpu
def test_on_the_gpu_the_bar_shows_values_of_the_run_without_waiting(tmp_path):
    if not torch.cuda.is_available():
        pytest.fail("this GPU test needs CUDA: run it on the GPU machine (pytest -m gpu)")
    # without the speedup, Lightning's conversion waits for the GPU at every step: the sync debug mode raises
    with pytest.raises(RuntimeError, match="synchroniz"):
        fit_and_watch_the_bar(tmp_path / "stock", "cuda", steps=6, sleep_cycles=GPU_BUSY_CYCLES, strict_from=2)
    with progress_bar_without_waiting():
        after_step, after_epoch, logged = fit_and_watch_the_bar(
            tmp_path / "ours", "cuda", steps=6, sleep_cycles=GPU_BUSY_CYCLES, strict_from=2
        )
    assert len(after_step) == len(logged) == 12
    late = 0
    for step, shown in enumerate(after_step):
        earlier = [values["loss"] for values in logged[: step + 1]]
        assert type(shown["loss"]) is float and shown["loss"] in earlier  # one of the run's values, never a later one
        late += shown["loss"] != logged[step]["loss"]
    assert late > 0  # some steps showed an older value rather than waiting for theirs
    second_epoch = [values["loss"] for values in logged[6:]]
    assert after_epoch[-1]["train/loss"] == pytest.approx(sum(second_epoch) / len(second_epoch), rel=1e-5)

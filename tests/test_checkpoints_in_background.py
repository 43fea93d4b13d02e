"""checkpoints_in_background: each checkpoint is written by a background thread, as it was when Lightning asked for
it, and a failed write stops training with its error; rfdetr's Trainer gets the plugin inside the block only."""

from __future__ import annotations

import pytest
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from rfdetr_coco_pipeline.hooks import NAMES
from rfdetr_coco_pipeline.hooks.patches.checkpoints_in_background import (
    HostSnapshotCheckpointIO,
    checkpoints_in_background,
)
from tests.helpers.workflow import run_snakemake, tiny_config, write_config


def saved_and_changed(device: str, path) -> tuple[dict, dict]:
    """Save a checkpoint through the plugin, change its tensors in place at once, wait for the writer: what was
    saved (as loaded back) and what it was when saved."""
    weights = torch.arange(1_000_000, dtype=torch.float32, device=device)
    steps = torch.tensor([3], device=device)
    checkpoint = {"epoch": 3, "state_dict": {"weights": weights}, "optimizer_states": [{"step": steps}]}
    before = {"weights": weights.cpu().clone(), "step": steps.cpu().clone()}
    writer = HostSnapshotCheckpointIO(TorchCheckpointIO())
    writer.save_checkpoint(checkpoint, path)
    weights.add_(1.0)  # the next training step, while the thread may still write
    steps.add_(1)
    writer.teardown()  # Lightning's teardown at the end of fit: joins the writer
    return torch.load(path, weights_only=False), before


def test_the_file_holds_the_checkpoint_as_it_was_when_saved(tmp_path):
    loaded, before = saved_and_changed("cpu", tmp_path / "last.ckpt")
    assert loaded["epoch"] == 3
    assert torch.equal(loaded["state_dict"]["weights"], before["weights"])
    assert torch.equal(loaded["optimizer_states"][0]["step"], before["step"])


@pytest.mark.gpu
def test_on_the_gpu_the_file_holds_the_checkpoint_as_it_was_and_on_the_host(tmp_path):
    loaded, before = saved_and_changed("cuda", tmp_path / "last.ckpt")
    assert loaded["state_dict"]["weights"].device.type == "cpu"  # the snapshot was taken on the host
    assert torch.equal(loaded["state_dict"]["weights"], before["weights"])
    assert torch.equal(loaded["optimizer_states"][0]["step"], before["step"])


def test_a_failed_write_is_raised_when_training_ends(tmp_path):
    (tmp_path / "a_file").write_text("")
    writer = HostSnapshotCheckpointIO(TorchCheckpointIO())
    # raised by the next save, or at the latest by the teardown at the end of fit, whichever comes after the failure
    with pytest.raises(OSError, match="a_file"):
        writer.save_checkpoint({"epoch": 0}, tmp_path / "a_file" / "last.ckpt")  # a folder that cannot exist
        writer.teardown()


def test_rfdetrs_trainer_writes_through_the_plugin_inside_the_block_only(tmp_path):
    import rfdetr.training
    from lightning_fabric.plugins.environments import LightningEnvironment
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training import build_trainer as stock_build_trainer

    configs = (
        TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path), devices=2),
        RFDETRNanoConfig(pretrain_weights=None),
    )
    with checkpoints_in_background():
        # as rfdetr's train() calls it, with the workflow's own plugin for two GPUs of one node (trainer_hook)
        trainer = rfdetr.training.build_trainer(*configs, accelerator="cpu", plugins=[LightningEnvironment()])
    assert isinstance(trainer.strategy.checkpoint_io, HostSnapshotCheckpointIO)
    assert isinstance(trainer.strategy.cluster_environment, LightningEnvironment)  # the other plugin is kept
    assert rfdetr.training.build_trainer is stock_build_trainer
    assert not isinstance(
        stock_build_trainer(*configs, accelerator="cpu").strategy.checkpoint_io, HostSnapshotCheckpointIO
    )


def test_after_an_error_in_training_the_finished_epochs_checkpoint_is_complete(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Failing(BoringModel):
        def training_step(self, batch, batch_idx):
            if self.current_epoch == 1:
                raise RuntimeError("the node went away")
            return super().training_step(batch, batch_idx)

    last = ModelCheckpoint(dirpath=tmp_path, filename="last", every_n_epochs=1, save_on_train_epoch_end=True)
    trainer = pl.Trainer(
        max_epochs=3,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[last],
        plugins=[HostSnapshotCheckpointIO()],
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    with pytest.raises(RuntimeError, match="the node went away"):
        trainer.fit(Failing())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)  # Lightning's teardown joined the writer
    assert saved["epoch"] == 0 and saved["global_step"] == 2


@pytest.mark.slow
def test_the_next_block_resumes_from_the_checkpoint_a_background_thread_wrote(workdir, server, archives):
    speedups = ["checkpoints_in_background"]  # on the CPU auto leaves it off: named, it applies
    write_config(workdir, tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=1, speedups=speedups))
    result = run_snakemake(workdir, "results/train/block_02/checkpoint.ckpt")
    assert result.returncode == 0, result.stdout[-5000:]
    logs = workdir / "results" / "logs" / "train"
    first, second = ((logs / f"block_0{n}.log").read_text() for n in (1, 2))
    assert f"Speedups applied (1 of {len(NAMES)}): checkpoints_in_background" in first
    assert "resuming from the previous block's checkpoint" in second
    blocks = workdir / "results" / "train"
    epochs = [torch.load(blocks / b / "checkpoint.ckpt", weights_only=False)["epoch"] for b in ("block_01", "block_02")]
    assert epochs == [0, 1]

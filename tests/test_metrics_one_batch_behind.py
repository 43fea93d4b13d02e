"""The metrics_one_batch_behind speedup: rfdetr's validation callback, one batch behind, gives rfdetr's metrics.

Real Lightning validation loops drive rfdetr's real `COCOEvalCallback`; a small module's `validation_step` returns
detections at COCO's scale (`bench.synth_detections`) in the form rfdetr's `validation_step` returns them.
"""

from __future__ import annotations

import pytest
import torch

from bench.synth_detections import validation_batch
from rfdetr_extensions.patches.metrics_one_batch_behind import KEPT, metrics_one_batch_behind
from tests.helpers.lightning_trainer import small_trainer

BATCHES, IMAGES = 5, 12


def detections(batch_index: int, device: torch.device) -> dict:
    """One batch as rfdetr's validation_step returns it: post-processed predictions (xyxy pixels) and the batch's
    targets (normalised cxcywh boxes, original sizes, image ids)."""
    preds, truths = validation_batch(torch.Generator().manual_seed(batch_index), images=IMAGES)
    size = torch.tensor([480, 640])
    targets = []
    for image, truth in enumerate(truths):
        xyxy = truth["boxes"] / torch.tensor([640.0, 480.0, 640.0, 480.0])
        cxcywh = torch.cat([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1)
        targets.append(
            {
                "boxes": cxcywh,
                "labels": truth["labels"],
                "iscrowd": truth["iscrowd"],
                "area": truth["area"],
                "orig_size": size,
                "image_id": torch.tensor(batch_index * IMAGES + image),
            }
        )
    move = lambda items: [{key: value.to(device) for key, value in item.items()} for item in items]  # noqa: E731
    return {"results": move(preds), "targets": move(targets)}


def validated(tmp_path, behind: bool, accelerator: str = "cpu") -> tuple[dict, list[tuple[int, int, bool]]]:
    """The metrics rfdetr's callback logs over one validation and, for each batch rfdetr's batch end saw, in order:
    its index, how many forward passes had run by then, and whether its outputs were on the host."""
    import pytorch_lightning as pl
    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback

    from rfdetr_extensions.patching import patch_rfdetr

    forward_passes = []
    seen: list[tuple[int, int, bool]] = []

    class Detections(pl.LightningModule):
        def validation_step(self, batch, batch_index):
            forward_passes.append(batch_index)
            return detections(batch_index, self.device)

    def recorded(batch_end):
        def on_validation_batch_end(callback, trainer, module, outputs, batch, batch_index, *rest):
            on_host = all(value.device.type == "cpu" for item in outputs["results"] for value in item.values())
            seen.append((batch_index, len(forward_passes), on_host))
            return batch_end(callback, trainer, module, outputs, batch, batch_index, *rest)

        return on_validation_batch_end

    loader = torch.utils.data.DataLoader(torch.arange(BATCHES), batch_size=1)
    trainer = small_trainer(tmp_path, [COCOEvalCallback(max_dets=500, in_notebook=False)], 1, accelerator)
    with patch_rfdetr("rfdetr.training.callbacks.coco_eval:COCOEvalCallback", "on_validation_batch_end", recorded):
        if behind:
            with metrics_one_batch_behind():
                trainer.validate(Detections(), loader, verbose=False)
        else:
            trainer.validate(Detections(), loader, verbose=False)
    return {key: value.cpu() for key, value in trainer.callback_metrics.items()}, seen


def assert_same_metrics(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys() and "val/mAP_50_95" in ours and "val/F1" in ours
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    assert float(ours["val/mAP_50_95"]) > 0  # detections overlap their truths: a real evaluation


def test_rfdetrs_callback_sees_every_batch_one_forward_pass_later_and_gives_the_same_metrics(tmp_path):
    theirs, their_order = validated(tmp_path / "stock", behind=False)
    ours, our_order = validated(tmp_path / "behind", behind=True)
    assert their_order == [(index, index + 1, True) for index in range(BATCHES)]  # right after its own forward
    # after the next batch's forward pass; the last at the epoch's end, after the last forward pass
    assert our_order == [(index, min(index + 2, BATCHES), True) for index in range(BATCHES)]
    assert_same_metrics(ours, theirs)


def test_a_batch_left_from_an_unfinished_validation_is_dropped(tmp_path):
    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback

    callback = COCOEvalCallback(max_dets=500, in_notebook=False)
    with metrics_one_batch_behind():
        callback.__dict__[KEPT] = object()  # what an interrupted validation leaves behind
        trainer = small_trainer(tmp_path, [callback], 1)
        import pytorch_lightning as pl

        class Detections(pl.LightningModule):
            def validation_step(self, batch, batch_index):
                return detections(batch_index, self.device)

        trainer.validate(Detections(), torch.utils.data.DataLoader(torch.arange(2), batch_size=1), verbose=False)
    assert KEPT not in callback.__dict__  # dropped at the start, and the last batch handed on at the end
    assert "val/mAP_50_95" in trainer.callback_metrics


def test_rfdetrs_hooks_are_back_after_the_block():
    from rfdetr.training.callbacks.coco_eval import COCOEvalCallback

    hooks = ("on_validation_batch_end", "on_validation_epoch_end", "on_validation_epoch_start")
    before = [getattr(COCOEvalCallback, hook) for hook in hooks]
    with metrics_one_batch_behind():
        inside = [getattr(COCOEvalCallback, hook) for hook in hooks]
        assert all(mine is not original for mine, original in zip(inside, before, strict=True))
    assert [getattr(COCOEvalCallback, hook) for hook in hooks] == before


@pytest.mark.gpu
def test_on_the_gpu_the_metrics_are_rfdetrs(tmp_path):
    if not torch.cuda.is_available():
        pytest.fail("this GPU test needs CUDA: run it on the GPU machine (pytest -m gpu)")
    theirs, _ = validated(tmp_path / "stock", behind=False, accelerator="gpu")
    ours, our_order = validated(tmp_path / "behind", behind=True, accelerator="gpu")
    assert our_order == [(index, min(index + 2, BATCHES), True) for index in range(BATCHES)]
    assert_same_metrics(ours, theirs)

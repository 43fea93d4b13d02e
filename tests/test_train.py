"""The training script's pure parts: recipe identity, where a block resumes, metrics across resumes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.blocks import block_ranges
from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.hooks import Selection
from rfdetr_coco_pipeline.needs import training_job_cores
from rfdetr_coco_pipeline.settings import GpuProfile, Recipe
from rfdetr_coco_pipeline.training.device import Device
from rfdetr_coco_pipeline.training.fp8 import batch_multiple, last_batch_off_the_rule
from rfdetr_coco_pipeline.training.recipe import recipe_diff, recipe_id, run_recipe
from rfdetr_coco_pipeline.training.resume import (
    ResumePlan,
    in_progress_epoch,
    plan_resume,
    prepare_state,
    truncate_metrics,
)
from rfdetr_coco_pipeline.training.rfdetr_call import (
    LOGGER_PACKAGES,
    check_loggers,
    eval_batch_size,
    loader_workers,
    train_kwargs,
)
from rfdetr_coco_pipeline.training.route import Route
from tests.helpers.workflow import settings_of

SETTINGS = settings_of()
TRAIN = SETTINGS.train
PROFILE = GpuProfile(name="h200", batch_size=128, precision="bf16", compile=True, cuda_graphs=True)
CPU = Device("cpu", "CPU")
LOGGERS = ("csv", *LOGGER_PACKAGES)


def recipe(**changes) -> Recipe:
    return SETTINGS.recipe.model_copy(update=changes)


def test_blocks_cover_every_epoch_once_and_the_last_may_be_shorter():
    assert block_ranges(40, 10) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert block_ranges(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert block_ranges(3, 10) == [(0, 3)]


CHANGED = {  # another value for every recipe setting; lr_scaling changes the recipe only with several GPUs
    "epochs": 41,
    "seed": 1,
    "lr": 2e-4,
    "lr_encoder": 3e-4,
    "warmup_epochs": 2,
    "resolution": 416,
    "grad_accum_steps": 2,
    "multi_scale": True,
    "square_resize_div_64": False,
    "eval_interval": 2,
    "gpus": 2,
    "lr_scaling": "none",
    "nodes": 2,
}


def test_the_recipe_is_every_recipe_key_of_config_yamls_train_section_in_its_order():
    assert list(Recipe.model_fields) == list(CHANGED) and set(CHANGED) <= set(settings_of().recipe.model_dump())
    assert not set(Recipe.model_fields) & set(type(TRAIN).model_fields)  # how a run goes is kept apart


@pytest.mark.parametrize("key", list(CHANGED))
def test_every_recipe_setting_changes_the_recipe_id(key):
    base = recipe(gpus=2) if key == "lr_scaling" else recipe()
    changed = base.model_copy(update={key: CHANGED[key]})
    assert recipe_id(run_recipe(changed, PROFILE, "1.11.2")) != recipe_id(run_recipe(base, PROFILE, "1.11.2"))
    assert changed.as_parameter() != base.as_parameter()  # and the train rule's parameter: a new training


def test_the_profile_and_rfdetr_shape_the_recipe_and_how_to_run_settings_do_not():
    base = recipe_id(run_recipe(recipe(), PROFILE, "1.11.2"))
    assert recipe_id(run_recipe(recipe(), PROFILE.model_copy(update={"batch_size": 64}), "1.11.2")) != base
    assert recipe_id(run_recipe(recipe(), PROFILE.model_copy(update={"precision": "fp8"}), "1.11.2")) != base
    assert recipe_id(run_recipe(recipe(), PROFILE.model_copy(update={"num_queries": 30}), "1.11.2")) != base
    assert "num_queries" not in run_recipe(recipe(), PROFILE, "1.11.2")  # a row without it keeps its runs' ids
    assert recipe_id(run_recipe(recipe(), PROFILE, "1.12.0")) != base
    assert recipe_id(run_recipe(recipe(), PROFILE.model_copy(update={"compile": False}), "1.11.2")) == base
    how_to_run = {"max_workers": 4, "profile": "h100", "speedups": "none", "host_threads": 0, "loader_niceness": 0}
    other = settings_of(**how_to_run)
    assert other.recipe == SETTINGS.recipe and other.recipe.as_parameter() == SETTINGS.recipe.as_parameter()
    assert recipe_diff({"lr": 1, "batch_size": 2}, {"lr": 1, "batch_size": 4}) == "batch_size: 2 -> 4"


def test_a_recipe_keeps_its_values_as_written_so_its_id_and_parameter_stay_those_of_earlier_runs():
    """config.yaml's `warmup_epochs: 1` stays 1, not 1.0: the run's id (its state folder) and the train rule's
    parameter are those an earlier release computed from the same config, so its runs resume."""
    assert SETTINGS.recipe.as_parameter() == (
        '{"epochs": 40, "seed": 0, "lr": 0.0001, "lr_encoder": 0.00015, "warmup_epochs": 1, "resolution": 384, '
        '"grad_accum_steps": 1, "multi_scale": false, "square_resize_div_64": true, "eval_interval": 1, "gpus": 1, '
        '"lr_scaling": "linear"}'
    )


def test_the_learning_rate_follows_the_gpu_count_when_scaling_is_linear():
    assert run_recipe(recipe(gpus=4), PROFILE, "1.11.2")["lr"] == pytest.approx(4e-4)
    assert run_recipe(recipe(gpus=4, lr_scaling="none"), PROFILE, "1.11.2")["lr"] == pytest.approx(1e-4)


LAST, PREVIOUS = Path("state/last.ckpt"), Path("block_01/checkpoint.ckpt")


@pytest.mark.parametrize(
    ("state_epoch", "previous", "start", "end", "checkpoint", "next_epoch"),
    [
        (None, None, 0, 10, None, 0),  # first block, nothing yet
        (3, None, 0, 10, LAST, 4),  # first block interrupted after epoch 4 (0-based 3)
        (9, PREVIOUS, 10, 20, PREVIOUS, 10),  # second block starts where the first ended
        (14, PREVIOUS, 10, 20, LAST, 15),  # second block interrupted
        (19, PREVIOUS, 10, 20, LAST, 20),  # trained, but its outputs were not written: nothing to train
        (
            29,
            PREVIOUS,
            10,
            20,
            PREVIOUS,
            10,
        ),  # the state is further on (a later block ran): redo from the block's input
        (29, None, 0, 10, None, 0),
    ],
)
def test_a_block_resumes_from_the_newest_checkpoint_inside_it(
    state_epoch, previous, start, end, checkpoint, next_epoch
):
    plan = plan_resume(LAST, state_epoch, previous, start, end)
    assert (plan.checkpoint, plan.next_epoch) == (checkpoint, next_epoch)


def test_a_later_block_without_its_predecessor_is_an_error():
    with pytest.raises(StageError):
        plan_resume(LAST, None, None, 10, 20)


def test_a_first_block_with_a_damaged_checkpoint_starts_afresh_and_keeps_the_damaged_file(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")  # the start of a zip archive, and no more
    (state / "metrics.csv").write_text("epoch,step\n0,4\n")
    assert in_progress_epoch(state / "last.ckpt") is None
    (damaged,) = state.glob("last.damaged-*.ckpt")
    assert not (state / "last.ckpt").exists()
    plan = plan_resume(state / "last.ckpt", None, None, 0, 10)
    assert plan == ResumePlan(None, 0, "starting from scratch")
    prepare_state(state, plan)
    assert sorted(path.name for path in state.iterdir()) == [damaged.name]  # the earlier run's files go, it stays


def test_metrics_rows_of_epochs_to_be_trained_again_are_dropped(tmp_path):
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("epoch,step,train/loss\n0,4,3.0\n1,9,2.0\n2,14,1.0\n")
    truncate_metrics(metrics, next_epoch=2)
    assert metrics.read_text().splitlines() == ["epoch,step,train/loss", "0,4,3.0", "1,9,2.0"]


def test_the_validation_batch_divides_the_validation_set_so_its_shape_never_changes():
    assert eval_batch_size(5000, 128) == 125  # COCO val2017: 40 batches of 125, no last batch of 8
    assert eval_batch_size(5000, 128, ranks=2) == 125  # 2,500 per GPU
    assert eval_batch_size(5000, 128, ranks=4) == 125  # 1,250 per GPU
    assert eval_batch_size(500, 128) == 125
    assert eval_batch_size(4, 2) == 2
    assert eval_batch_size(4999, 128) == 128  # a prime: no divisor near the batch, one extra compile, not tiny batches
    assert eval_batch_size(4999, 128, ranks=2) == 125  # 2,500 per GPU (Lightning's sampler evens the shares)
    assert eval_batch_size(4999, 128, ranks=4) == 125  # 1,250 per GPU


def validation_batches(images: int, batch: int) -> list[int]:
    """The batch sizes of a validation loader without drop_last."""
    return [batch] * (images // batch) + ([images % batch] if images % batch else [])


# Rows per image of RF-DETR Nano's Transformer Engine layers at 384 px: the backbone's 4 windows of 145 tokens (the
# failing tensor of a validation batch of 125 was [500, 145, 384]), the encoder's 24 x 24 patches, 300 queries.
NANO_ROWS_AT_384 = (4 * 145, 24 * 24, 300)


@pytest.mark.parametrize(
    ("images", "ranks", "batch"),
    [(5000, 1, 100), (500, 1, 100), (5000, 2, 100), (5000, 4, 50), (500, 2, 50), (12288, 1, 128), (4, 1, 4)]
    + [(4999, 2, 100), (4999, 4, 50)],  # a prime count whose shares per GPU are even
)
def test_the_fp8_routes_validation_batches_all_have_rows_in_multiples_of_8(images, ranks, batch):
    multiple = batch_multiple(384)
    assert eval_batch_size(images, 128, ranks, multiple) == batch
    share = -(-images // ranks)
    for size in validation_batches(share, batch):
        assert all(size * rows % 8 == 0 for rows in NANO_ROWS_AT_384), (batch, size)
    assert last_batch_off_the_rule(images, batch, ranks, multiple) == 0


@pytest.mark.parametrize(
    ("images", "ranks", "batch", "last"),
    [(4999, 1, 128, 7), (5000, 8, 128, 113), (500, 4, 124, 1), (5, 1, 4, 1)],  # a prime; odd shares of 625, 125, 5
)
def test_a_validation_share_no_batch_size_splits_for_fp8_leaves_one_last_batch_off_the_rule(images, ranks, batch, last):
    """Every other batch keeps the rule, and every image is in a batch: the last one runs without FP8
    (the `fp8_validation` hook)."""
    multiple = batch_multiple(384)
    assert eval_batch_size(images, 128, ranks, multiple) == batch
    share = -(-images // ranks)
    *kept, final = validation_batches(share, batch)
    assert sum(kept) + final == share and final == last == last_batch_off_the_rule(images, batch, ranks, multiple)
    assert all(size * rows % 8 == 0 for size in kept for rows in NANO_ROWS_AT_384)
    assert any(final * rows % 8 for rows in NANO_ROWS_AT_384)


def rfdetr_train_config(loggers: list[str], dataset: Path, state_dir: Path):
    """rfdetr's own TrainConfig (a pydantic model that refuses unknown or mistyped fields) built from the training
    job's train() arguments; `device` and `resolution` are the two that train() takes off before building it."""
    from rfdetr.config import TrainConfig

    cpu = GpuProfile(name="cpu", batch_size=2, precision="fp32", compile=False, cuda_graphs=False)
    route = Route(CPU, cpu, "train.device is cpu", Selection((), ()), 1)
    kwargs = train_kwargs(run_recipe(recipe(), cpu, "1.11.2"), route, dataset, state_dir, 0, loggers)
    return TrainConfig(**{key: value for key, value in kwargs.items() if key not in ("device", "resolution")})


@pytest.mark.parametrize("loggers", [[name] for name in LOGGERS] + [list(TRAIN.loggers), list(LOGGERS)])
def test_each_of_train_loggers_becomes_the_flag_of_rfdetrs_training_config(loggers, tiny_dataset, tmp_path):
    config = rfdetr_train_config(loggers, tiny_dataset, tmp_path / "state" / "0123abcd")
    assert {flag for flag in ("tensorboard", "mlflow", "wandb") if getattr(config, flag)} == set(loggers) - {"csv"}
    assert (config.project, config.run) == ("rfdetr-coco2017", "0123abcd")  # W&B and MLflow runs: the recipe id


@pytest.mark.parametrize(
    ("loggers", "expected"),
    [(["csv"], ["CSVLogger"]), (["csv", "tensorboard"], ["CSVLogger", "TensorBoardLogger"])],
)
def test_rfdetrs_trainer_logs_where_train_loggers_says(loggers, expected, tiny_dataset, tmp_path):
    """rfdetr's own Lightning trainer, built from that config: CSV always, TensorBoard when asked, in the state
    folder (which TensorBoard reads as one run across the blocks)."""
    from rfdetr.config import RFDETRNanoConfig
    from rfdetr.training import build_trainer

    state = tmp_path / "state" / "0123abcd"
    trainer = build_trainer(rfdetr_train_config(loggers, tiny_dataset, state), RFDETRNanoConfig(), accelerator="cpu")
    assert [type(logger).__name__ for logger in trainer.loggers] == expected
    assert all(Path(logger.log_dir) == state for logger in trainer.loggers)


@pytest.mark.parametrize(("package", "logger_class"), [("mlflow", "MLFlowLogger"), ("wandb", "WandbLogger")])
def test_a_logger_whose_package_is_missing_stops_the_block_naming_the_package(
    package, logger_class, tiny_dataset, tmp_path
):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    check_loggers(TRAIN.loggers)  # the shipped loggers come with the workflow's install
    with pytest.raises(StageError) as stopped:
        check_loggers([*TRAIN.loggers, package])
    assert str(stopped.value) == (
        f"train.loggers names {package}, which is not installed: pip install {package} "
        "(or leave it out of train.loggers in config.yaml)."
    )
    # what the check saves the user from: rfdetr itself only warns, and the block trains without that logger
    from rfdetr.config import RFDETRNanoConfig
    from rfdetr.training import build_trainer

    config = rfdetr_train_config([package], tiny_dataset, tmp_path / "state" / "0123abcd")
    trainer = build_trainer(config, RFDETRNanoConfig(), accelerator="cpu")
    assert logger_class not in [type(logger).__name__ for logger in trainer.loggers]


def test_each_gpu_gets_max_workers_cores_and_its_rank_a_loader_of_that_many_workers():
    """With two GPUs the job asks for twice the cores and each rank's loader gets one GPU's share: not 16 workers
    per rank on 16 cores, as when every rank took the job's cores for its own."""
    one, two = training_job_cores(SETTINGS), training_job_cores(settings_of(gpus=2))
    assert (TRAIN.device, TRAIN.max_workers, one, two) == ("cuda", 16, 16, 32)
    assert loader_workers(two, 2, 16) == loader_workers(one, 1, 16) == 16
    assert loader_workers(16, 2, 16) == 8  # --cores 16 on a two-GPU machine: the cores are shared
    assert loader_workers(64, 1, 16) == 16  # never above train.max_workers
    assert training_job_cores(settings_of(max_workers=0, gpus=2)) == 2  # a core per rank, loading in it
    assert loader_workers(2, 2, 0) == 0
    # a CPU run computes the model on the host's cores, whatever its loader
    assert training_job_cores(settings_of(device="cpu", max_workers=0, gpus=2)) == 16

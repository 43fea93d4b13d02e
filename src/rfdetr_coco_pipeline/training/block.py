"""Train one block of epochs of RF-DETR Nano with the reference notebook's recipe (the train_block rule).

Every block calls rfdetr's `train()` with the run's full epoch count, so the cosine schedule is that of an
uninterrupted run, and stops at the end of its block (`StopAtBlockEnd`). The run's state lives in
`<results>/train/state/<recipe id>/`, which no failed job can delete; a block resumes from it or from the previous
block (`resume`). The route (device, GPU profile, speedups) is settled on the machine that trains; the log names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rfdetr_coco_pipeline.blocks import block_range
from rfdetr_coco_pipeline.common import StageError, log, read_json, where_this_runs, write_json
from rfdetr_coco_pipeline.data.dataset import reading_the_copy
from rfdetr_coco_pipeline.data.stage import this_nodes_report
from rfdetr_coco_pipeline.hooks import check_hooks
from rfdetr_coco_pipeline.settings import Settings
from rfdetr_coco_pipeline.training.ranks import check_srun_tasks, is_main_rank
from rfdetr_coco_pipeline.training.recipe import INIT_NOTE, recipe_id, run_recipe
from rfdetr_coco_pipeline.training.resume import (
    check_previous_block,
    checkpoint_epoch,
    export_block,
    lock_state,
    newest_state_checkpoint,
    plan_resume,
    prepare_state,
)
from rfdetr_coco_pipeline.training.rfdetr_call import (
    check_loggers,
    configure_compile_cache,
    loader_workers,
    run_rfdetr,
    train_kwargs,
)
from rfdetr_coco_pipeline.training.route import settle_route
from rfdetr_coco_pipeline.versions import software_versions


@dataclass(frozen=True)
class BlockJob:
    """What the train_block rule hands this job beside the settings: its block and files."""

    block: str  # block_01, block_02, ...
    stage_report: Path  # stage.json: where this node reads the dataset from
    previous_block: Path | None  # the previous block's output folder; None for the first block
    outdir: Path
    threads: int  # the job's cores


def train_block(settings: Settings, job: BlockJob, rfdetr_version: str) -> None:
    """Train `job`'s block (resuming where the run's state says), then write the block's outputs."""
    start, end = block_range(settings, job.block)
    if settings.srun_launch:
        check_srun_tasks(settings.recipe.gpus, settings.recipe.nodes)
    state_root = settings.paths.state
    configure_compile_cache(state_root)
    check_loggers(settings.train.loggers)
    check_hooks()
    route = settle_route(settings, rfdetr_version)
    stage, copy_users = reading_the_copy(read_json(this_nodes_report(job.stage_report)))  # held until it ends
    log.info(INIT_NOTE)

    recipe = run_recipe(settings.recipe, route.profile, rfdetr_version)
    run_id = recipe_id(recipe)
    state_dir = state_root / run_id
    log.info("Recipe %s: %s", run_id, json.dumps(recipe, sort_keys=True))
    previous = check_previous_block(job.previous_block, recipe, run_id) if job.previous_block else None
    main_rank = is_main_rank()  # under DDP, Lightning starts the other ranks by running this script again
    if main_rank:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_state(state_dir)  # held until this process ends  # noqa: F841
        write_json(state_dir / "recipe.json", recipe)

    state_last = state_dir / "last.ckpt"
    plan = plan_resume(*newest_state_checkpoint(state_dir, set_aside=main_rank), previous, start, end)
    log.info("Epochs %d-%d of %d: %s", start + 1, end, recipe["epochs"], plan.note)
    if main_rank:
        prepare_state(state_dir, plan)
    if plan.next_epoch < end:
        gpus, max_workers = settings.recipe.gpus, settings.train.max_workers
        workers = loader_workers(job.threads, gpus, max_workers)
        log.info(
            "Data-loader workers: %d per rank (%d cores for %d rank(s), train.max_workers: %d)",
            workers,
            job.threads,
            gpus,
            max_workers,
        )
        kwargs = train_kwargs(recipe, route, Path(stage["path"]), state_dir, workers, settings.train.loggers)
        if plan.checkpoint is not None:
            kwargs["resume"] = str(plan.checkpoint)
        run_rfdetr(settings, route, kwargs, end)
    if not main_rank:
        return
    if checkpoint_epoch(state_last) + 1 != end:
        raise StageError(f"Training stopped before epoch {end}; see the log above. Run snakemake again to resume.")
    run_info = {
        "recipe_id": run_id,
        "recipe": recipe,
        "profile": route.profile.model_dump(),
        "profile_reason": route.reason,
        "speedups": route.speedups.names(),
        "speedups_left_off": {speedup.name: why for speedup, why in route.speedups.left_off},
        "device": route.device.describe(),
        "versions": software_versions(),
        **where_this_runs(),
        "epochs": [start, end],
        "resumed_from": str(plan.checkpoint) if plan.checkpoint else None,
        "dataset": stage,
        "state_dir": str(state_dir),
        "initialisation": INIT_NOTE,
    }
    write_json(
        state_dir / "profile.json",
        {"profile": route.profile.model_dump(), "reason": route.reason, "device": route.device.describe()},
    )
    export_block(state_dir, job.outdir, start, end, run_info)
    if end == recipe["epochs"] and settings.stage.remove_after_training and copy_users is not None:
        copy_users.remove_unless_used()  # not while another run trains from it

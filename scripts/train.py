"""Train one block of epochs of RF-DETR Nano with the reference notebook's recipe (the train_block rule).

Every block calls rfdetr's `train()` with the run's full epoch count, so the cosine schedule is that of an
uninterrupted run, and stops at the end of its block (`StopAtBlockEnd`). The run's state lives in
`results/train/state/<recipe id>/`, which no failed job can delete; a block resumes from it or from the previous
block (`pipeline.resume`). The GPU profile is picked from the GPU found here (`pipeline.gpu_profiles`), and the
speedups from `train.speedups` and the installed rfdetr (`rfdetr_extensions.select_speedups`); the log names both.
Shown by
`tests/test_pipeline.py::test_blocks_follow_the_learning_rate_schedule_of_one_uninterrupted_run`,
`tests/test_pipeline.py::test_a_block_never_resumes_a_checkpoint_made_under_another_recipe`,
`tests/test_faults.py::test_sigkill_of_snakemake_mid_training_resumes_from_the_last_epoch`,
`tests/test_faults.py::test_sigterm_of_a_training_job_stops_it_with_the_last_completed_epoch_saved`,
`tests/test_rfdetr_extensions.py::test_with_another_rfdetr_auto_trains_with_stock_rfdetr_and_the_log_lists_what_was_left_off`
and, on a GPU, `tests/test_gpu.py::test_the_h200_row_as_a_user_gets_it_captures_and_replays_cuda_graphs`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.common import StageError, log, pipeline_config, read_json, run_main, where_this_runs, write_json
from pipeline.dataset import reading_the_copy
from pipeline.ranks import die_with_parent, is_main_rank
from pipeline.recipe import INIT_NOTE, recipe_id, recipe_of
from pipeline.resume import (
    check_previous_block,
    checkpoint_epoch,
    export_block,
    lock_state,
    plan_resume,
    prepare_state,
)
from pipeline.rfdetr_call import (
    check_loggers,
    configure_compile_cache,
    loader_workers,
    run_rfdetr,
    train_kwargs,
    training_route,
)
from pipeline.versions import software_versions
from rfdetr_extensions.patching import installed_rfdetr


def train_block(args: argparse.Namespace, settings: Mapping[str, Any], rfdetr_version: str) -> None:
    train = {**settings["train"], **json.loads(args.recipe)}
    start, end = args.start_epoch, args.end_epoch
    configure_compile_cache(args.state_root)

    check_loggers(train["loggers"])
    route = training_route(train, settings["gpu_profiles"], rfdetr_version)
    device, speedups, profile, reason = route.device, route.speedups, route.profile, route.reason
    stage, copy_users = reading_the_copy(read_json(args.stage_report))  # held until this process ends
    log.info(INIT_NOTE)

    recipe = recipe_of(train, profile, rfdetr_version)
    run_id = recipe_id(recipe)
    state_dir = args.state_root / run_id
    log.info("Recipe %s: %s", run_id, json.dumps(recipe, sort_keys=True))
    previous = check_previous_block(args.previous_block, recipe, run_id) if args.previous_block else None
    main_rank = is_main_rank()  # under DDP, Lightning starts the other ranks by running this script again
    if main_rank:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_state(state_dir)  # held until this process ends  # noqa: F841
        write_json(state_dir / "recipe.json", recipe)

    state_last = state_dir / "last.ckpt"
    plan = plan_resume(state_last, checkpoint_epoch(state_last) if state_last.is_file() else None, previous, start, end)
    log.info("Epochs %d-%d of %d: %s", start + 1, end, recipe["epochs"], plan.note)
    if main_rank:
        prepare_state(state_dir, plan)
    if plan.next_epoch < end:
        workers = loader_workers(args.threads, recipe["gpus"], train["max_workers"])
        log.info(
            "Data-loader workers: %d per rank (%d cores for %d rank(s), train.max_workers: %d)",
            workers,
            args.threads,
            recipe["gpus"],
            train["max_workers"],
        )
        kwargs = train_kwargs(recipe, stage["path"], state_dir, workers, device, train["loggers"])
        if plan.checkpoint is not None:
            kwargs["resume"] = str(plan.checkpoint)
        run_rfdetr(recipe, route, kwargs, end, train)
    if not main_rank:
        return
    if checkpoint_epoch(state_last) + 1 != end:
        raise StageError(f"Training stopped before epoch {end}; see the log above. Run snakemake again to resume.")
    run_info = {
        "recipe_id": run_id,
        "recipe": recipe,
        "profile": profile,
        "profile_reason": reason,
        "speedups": speedups.names(),
        "speedups_left_off": {speedup.name: why for speedup, why in speedups.left_off},
        "device": device.describe(),
        "versions": software_versions(),
        **where_this_runs(),
        "epochs": [start, end],
        "resumed_from": str(plan.checkpoint) if plan.checkpoint else None,
        "dataset": stage,
        "state_dir": str(state_dir),
        "initialisation": INIT_NOTE,
    }
    write_json(state_dir / "profile.json", {"profile": profile, "reason": reason, "device": device.describe()})
    export_block(state_dir, args.outdir, start, end, run_info)
    if end == recipe["epochs"] and settings["stage"]["remove_after_training"] and copy_users is not None:
        copy_users.remove_unless_used()  # not while another run trains from it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", required=True, help="JSON: the recipe settings of config.yaml's train section")
    parser.add_argument("--start-epoch", required=True, type=int)
    parser.add_argument("--end-epoch", required=True, type=int)
    parser.add_argument(
        "--previous-block", type=lambda s: Path(s) if s else None, help="output folder of the previous block"
    )
    parser.add_argument("--stage-report", required=True, type=Path, help="stage.json: where the dataset is")
    parser.add_argument("--state-root", required=True, type=Path)
    parser.add_argument("--outdir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    die_with_parent()  # rank 0 ends with the job's shell, the ranks Lightning starts with rank 0
    train_block(args, pipeline_config(), installed_rfdetr())


if __name__ == "__main__":
    run_main(main)

"""Compile the training step's graphs into the run's compile cache before the first training job (the
compile_warmup rule). What it does and why: `pipeline.compile_warmup`.

Writes a JSON report: whether it compiled (or why not), the GPU profile and speedups, and the warm-up's images,
seconds and torch.compile cache lookups. A failure is reported and logged, not raised: the warm-up only saves time,
and the first training job then compiles as it would have, reporting any real problem itself.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.common import log, pipeline_config, run_main, where_this_runs, write_json
from pipeline.compile_warmup import compile_by_training, skip_reason
from pipeline.recipe import recipe_of
from pipeline.rfdetr_call import configure_compile_cache, training_route
from rfdetr_extensions.patching import installed_rfdetr


def warm_up(args: argparse.Namespace, settings: Mapping[str, Any], rfdetr_version: str) -> dict[str, Any]:
    """The warm-up on the route the train stage will take here; its report (see the module's text)."""
    train = {**settings["train"], **json.loads(args.recipe)}
    configure_compile_cache(args.state_root)  # the cache the train stage reads
    route = training_route(train, settings["gpu_profiles"], rfdetr_version)
    report: dict[str, Any] = {"profile": route.profile["name"], "speedups": route.speedups.names()}
    reason = skip_reason(route, train["gpus"])
    if reason:
        log.info("Compile warm-up: nothing to compile (%s)", reason)
        return {"compiled": False, "reason": reason, **report}
    recipe = recipe_of(train, route.profile, rfdetr_version)
    return {"compiled": True, **compile_by_training(train, route, recipe, args.dataset, args.threads), **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, help="JSON: the recipe settings of config.yaml's train section")
    parser.add_argument("--dataset", required=True, type=Path, help="the dataset folder (val2017/, annotations/)")
    parser.add_argument("--state-root", required=True, type=Path, help="results/train/state: the compile cache")
    parser.add_argument("--report", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=2, help="data-loader workers of the warm-up's training")
    args = parser.parse_args()
    try:
        report = warm_up(args, pipeline_config(), installed_rfdetr())
    except Exception as error:  # the warm-up only saves time; the first training job reports real problems
        log.exception("Compile warm-up failed; the first training job will compile instead")
        report = {"compiled": False, "reason": f"failed: {type(error).__name__}: {error}"}
    write_json(args.report, {**report, **where_this_runs()})


if __name__ == "__main__":
    run_main(main)

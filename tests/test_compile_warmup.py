"""The compile warm-up (rules/compile_warmup.smk, training/compile_warmup.py) on the CPU: where it sits in the
workflow, the set it trains on, its one epoch through real rfdetr, and a failure that leaves the run going. That its
graphs are the ones training looks up needs a GPU: tests/test_gpu.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.hooks import select_speedups
from rfdetr_coco_pipeline.settings import GpuProfile
from rfdetr_coco_pipeline.training.compile_warmup import (
    compile_by_training,
    skip_reason,
    warmup_images,
    write_warmup_dataset,
)
from rfdetr_coco_pipeline.training.device import Device
from rfdetr_coco_pipeline.training.recipe import run_recipe
from rfdetr_coco_pipeline.training.rfdetr_call import eval_batch_size
from rfdetr_coco_pipeline.training.route import Route, settle_route
from rfdetr_coco_pipeline.versions import package_version
from tests.helpers.workflow import run_snakemake, settings_of, snakemake_command, tiny_config, write_config

H200 = Device("cuda", "NVIDIA H200", (9, 0), 141.0, 1)


def dag_edges(workdir: Path) -> set[tuple[str, str]]:
    """(job, job it waits for) pairs of `snakemake --dag`, each job named "rule" or "rule:wildcard value"."""
    dot = subprocess.run(snakemake_command(workdir, "--dag"), cwd=workdir, capture_output=True, text=True, check=True)
    names = {
        node: ":".join([rule, *(value.split(": ")[-1] for value in wildcards)])
        for node, rule, *wildcards in (
            (node, *label.split("\\n")) for node, label in re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dot.stdout, re.M)
        )
    }
    return {(names[later], names[earlier]) for earlier, later in re.findall(r"^\s*(\d+) -> (\d+)", dot.stdout, re.M)}


WARMUP_EDGES = {
    ("compile_warmup", "extract_archive:annotations"),
    ("compile_warmup", "extract_archive:val2017"),
    ("train_block:block_01", "compile_warmup"),
}


@pytest.mark.parametrize(
    ("device", "train", "extracted", "reported", "expected"),
    [
        ("cuda", {}, False, False, WARMUP_EDGES),
        ("cuda", {"compile_warmup": False}, False, False, set()),
        ("cpu", {}, False, False, set()),
        ("cuda", {}, True, False, set()),  # train2017 already there: no download to run beside
        # a later run of a run that warmed up: the first block keeps the inputs it trained with
        ("cuda", {}, True, True, WARMUP_EDGES),
    ],
)
def test_on_a_gpu_run_the_first_block_waits_for_the_warmup_which_runs_beside_the_train2017_download(
    tmp_path, server, archives, device, train, extracted, reported, expected
):
    write_config(tmp_path, tiny_config(tmp_path, server.url, archives, device=device, epochs=2, **train))
    if extracted:
        (tmp_path / "data" / "coco2017" / "train2017").mkdir(parents=True)
    if reported:
        (tmp_path / "results" / "train").mkdir(parents=True)
        (tmp_path / "results" / "train" / "compile_warmup.json").write_text('{"compiled": true}')
    edges = dag_edges(tmp_path)
    assert {edge for edge in edges if "compile_warmup" in edge} == expected
    # the train2017 download waits for val2017's extraction, as the warm-up does, and not for the warm-up
    download = "download_archive:train2017"
    assert extracted or (download, "extract_archive:val2017") in edges
    assert (download, "compile_warmup") not in edges and ("train_block:block_02", "compile_warmup") not in edges


def test_the_warmup_set_links_val2017_images_with_boxes_first_and_keeps_every_category(tiny_dataset, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(tiny_dataset / "val2017", source / "val2017")
    annotations = json.loads((tiny_dataset / "annotations" / "instances_val2017.json").read_text())
    without_boxes = annotations["images"][0]["id"]
    annotations["annotations"] = [a for a in annotations["annotations"] if a["image_id"] != without_boxes]
    (source / "annotations").mkdir()
    (source / "annotations" / "instances_val2017.json").write_text(json.dumps(annotations))

    assert write_warmup_dataset(source, tmp_path / "warmup", 3) == 3
    for split in ("train2017", "val2017"):
        subset = json.loads((tmp_path / "warmup" / "annotations" / f"instances_{split}.json").read_text())
        assert without_boxes not in {image["id"] for image in subset["images"]}
        assert {a["image_id"] for a in subset["annotations"]} == {image["id"] for image in subset["images"]}
        assert subset["categories"] == annotations["categories"]
        links = sorted((tmp_path / "warmup" / split).iterdir())
        assert [link.name for link in links] == sorted(image["file_name"] for image in subset["images"])
        assert all(link.is_symlink() and link.resolve().parent == (source / "val2017").resolve() for link in links)
    # all four images, the one without boxes last
    assert write_warmup_dataset(source, tmp_path / "all", 10) == 4


def test_the_warmup_trains_one_epoch_of_the_runs_route_at_the_runs_validation_batch(
    tiny_dataset, tmp_path, monkeypatch
):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    settings = settings_of(tiny_config(tmp_path, "http://unused", {}, epochs=2))
    route = settle_route(settings, package_version("rfdetr"))
    recipe = run_recipe(settings.recipe, route.profile, package_version("rfdetr"))

    result = compile_by_training(settings, route, recipe, tiny_dataset, workers=0)

    assert result["images"] == warmup_images(tiny_dataset, recipe, route) == eval_batch_size(4, recipe["batch_size"])
    assert result["seconds"] > 0
    assert set(result["compile_cache"]) == {"graph_hits", "graph_misses", "autograd_hits", "autograd_misses"}
    assert not list(scratch.glob("compile-warmup-*"))  # its set and its training's state were scratch


@pytest.mark.parametrize(
    ("device", "profile", "gpus", "expected"),
    [
        (Device("cpu", "cpu"), ("cpu", False), 1, "training runs on the CPU"),
        (H200, ("rtx-pro-6000-fp8", False), 1, "'rtx-pro-6000-fp8' does not compile"),
        (H200, ("h200", True), 2, "DDP compiles one graph per gradient bucket"),
        (H200, ("h200", True), 1, None),
    ],
)
def test_the_warmup_says_why_when_it_would_compile_nothing_training_uses(device, profile, gpus, expected):
    name, compiled = profile
    row = GpuProfile(name=name, batch_size=128, precision="bf16", compile=compiled, cuda_graphs=False)
    route = Route(device, row, "test", select_speedups("auto", package_version("rfdetr")), 1)
    reason = skip_reason(route, gpus)
    assert reason == expected if expected is None else expected in reason


def test_a_failed_warmup_is_reported_and_the_download_goes_on(tmp_path, server, archives):
    """On this GPU-less machine a GPU run's warm-up cannot compile: it says why, and the data still arrives."""
    write_config(tmp_path, tiny_config(tmp_path, server.url, archives, device="cuda"))
    report = tmp_path / "results" / "train" / "compile_warmup.json"
    result = run_snakemake(
        tmp_path, str(report.relative_to(tmp_path)), "data/coco2017/train2017", "--config", "preflight=false"
    )
    assert result.returncode == 0, result.stdout[-5000:]
    written = json.loads(report.read_text())
    assert written["compiled"] is False and written["reason"].startswith("failed: StageError: No CUDA GPU")
    log = (tmp_path / "results" / "logs" / "train" / "compile_warmup.log").read_text()
    assert "the first training job will compile instead" in log
    assert (tmp_path / "results" / "benchmarks" / "train" / "compile_warmup.tsv").is_file()
    assert len(list((tmp_path / "data" / "coco2017" / "train2017").glob("*.jpg"))) == 8

"""The whole workflow, end to end: the real `snakemake` command, real HTTP on 127.0.0.1, real rfdetr training
(RF-DETR Nano at 64 px on the CPU), and failures injected once, each followed by a run that redoes only
what the failure touched."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from rfdetr_coco_pipeline.hooks import NAMES
from tests.helpers.archive_server import ArchiveServer
from tests.helpers.figures import block_starts, drawn, lines_labelled
from tests.helpers.workflow import (
    REPO,
    jobs_run,
    run_snakemake,
    tiny_config,
    write_config,
)

pytestmark = pytest.mark.slow
ARCHIVE_NAMES = ["annotations_trainval2017.zip", "val2017.zip", "train2017.zip"]
BLOCK_FILES = ["checkpoint.ckpt", "best.pth", "metrics.csv", "epochs.json", "run.json", "stage.json"]


@pytest.fixture(scope="module")
def module_server(archives):
    with ArchiveServer(next(iter(archives.values()))["path"].parent) as running:
        yield running


@pytest.fixture(scope="module")
def two_block_run(tmp_path_factory, module_server, archives):
    """The full workflow, 2 epochs in blocks of 1 epoch, run once for the tests of this module."""
    workdir = tmp_path_factory.mktemp("two_blocks")
    write_config(workdir, tiny_config(workdir, module_server.url, archives, epochs=2, epochs_per_block=1))
    result = run_snakemake(workdir)
    assert result.returncode == 0, result.stdout[-5000:]
    return workdir, result, list(module_server.requests)


def test_every_stage_leaves_its_outputs(two_block_run, tiny_dataset):
    workdir, result, requests = two_block_run
    assert jobs_run(result.stdout).count("train_block") == 2
    # download: each archive fetched exactly once, then deleted after extraction (keep_archives: false)
    assert sorted(r.name for r in requests if r.method == "GET") == sorted(ARCHIVE_NAMES)
    assert list((workdir / "data" / "archives").glob("*.zip")) == []
    # extract: the COCO layout rfdetr's dataset_file="coco" reads
    dataset = workdir / "data" / "coco2017"
    for folder in ("train2017", "val2017", "annotations"):
        extracted = sorted(p.name for p in (dataset / folder).iterdir() if p.name != ".snakemake_timestamp")
        assert extracted == sorted(p.name for p in (tiny_dataset / folder).iterdir())
    # verify: the report carries the counts
    report = json.loads((workdir / "results" / "verify" / "dataset.json").read_text())
    assert report["splits"]["train2017"]["images"] == 8 and report["splits"]["val2017"]["images"] == 4
    # stage + train: each block's outputs; training read the RAM-disk copy, removed after the last block
    for block, epochs in (("block_01", [0]), ("block_02", [1])):
        folder = workdir / "results" / "train" / block
        assert all((folder / name).is_file() for name in BLOCK_FILES)
        assert json.loads((folder / "stage.json").read_text())["where"] == "ramdisk"
        run = json.loads((folder / "run.json").read_text())
        assert run["profile"]["name"] == "cpu" and run["epochs"] == [epochs[0], epochs[0] + 1]
        records = json.loads((folder / "epochs.json").read_text())
        assert [r["epoch"] for r in records] == epochs
        # the training process froze its objects after the epoch's first steps (the gc_freeze speedup)
        assert all(r["frozen_objects"] > 10_000 for r in records)
        # where the validation's time went (its end: rfdetr's COCO metric), and torch.compile's cache lookups
        for r in records:
            assert sum(r["validation"].values()) == pytest.approx(r["val_seconds"], abs=0.01)
            assert r["validation"]["batches_seconds"] > 0 and r["validation"]["end_seconds"] > 0
            assert set(r["compile_cache"]) == {"graph_hits", "graph_misses", "autograd_hits", "autograd_misses"}
        assert torch.load(folder / "checkpoint.ckpt", map_location="cpu", weights_only=False)["epoch"] == epochs[-1]
    assert not list((workdir / "shm").glob("rfdetr-coco2017-*"))  # the copy, removed after the last block
    # logs and benchmarks per rule
    for rule_log in ("download/train2017.log", "extract/val2017.log", "verify/dataset.log", "train/block_02.log"):
        assert (workdir / "results" / "logs" / rule_log).stat().st_size > 0
    # 10 + check_gpus + evaluate + export + front_page
    assert len(list((workdir / "results" / "benchmarks").rglob("*.tsv"))) == 14
    train_log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "loads NO DINOv2 backbone weights" in train_log
    # train.host_threads applies to GPU runs; this CPU run computes the model on the host with torch's default
    assert f"Host threads of the training process: {torch.get_num_threads()}" in train_log
    # the job's 2 cores (--cores 2) for its one rank; the tiny config loads in the training process
    assert "Data-loader workers: 0 per rank (2 cores for 1 rank(s), train.max_workers: 0)" in train_log


def test_the_run_ends_by_saying_what_it_made_and_where(two_block_run):
    workdir, result, _ = two_block_run
    text = (workdir / "results" / "plots" / "summary.txt").read_text()
    summary = json.loads(text[text.index("{") :])
    evaluation = json.loads((workdir / "results" / "eval" / "metrics.json").read_text())
    end = result.stdout[result.stdout.rindex("The workflow finished.") :]
    best = f"best val mAP@50:95 {summary['best_map_50_95']:.3f} at epoch {summary['best_epoch']} (from 0"
    assert f"Trained 2 epochs: {best}" in end and f"AP {evaluation['AP']:.3f}, AP50 {evaluation['AP50']:.3f}" in end
    for product in ("train/block_02/best.pth", "export/model.onnx", "eval/metrics.json", "eval/per_class.csv", "plots"):
        assert f"  results/{product}\n" in end, product
    assert "snakemake --report report.html" in end and "tensorboard --logdir results/train/state" in end


def test_the_training_figure_shows_every_step_each_epoch_and_where_a_block_began(two_block_run):
    workdir = two_block_run[0]
    assert (workdir / "results" / "plots" / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes, records = drawn(workdir, ["block_01", "block_02"])
    assert set(axes) == {
        "Training loss per step",
        "Learning rate per step",
        "Loss: classification",
        "Loss: box L1",
        "Loss: box GIoU",
        "Validation mAP per epoch",
        "Images/s and peak GPU memory per epoch",
    }
    loss = lines_labelled(axes["Training loss per step"])
    steps = [value for record in records for value in record["loss"]]
    assert list(loss["each step"].get_ydata()) == steps and len(loss["smoothed"].get_ydata()) == len(steps)
    assert max(loss["each step"].get_xdata()) == 2  # the second epoch's last step ends it
    rates = lines_labelled(axes["Learning rate per step"])["learning rate"]
    assert list(rates.get_ydata()) == [lr for record in records for lr in record["lr"]]
    for title, axis in axes.items():
        labels = [label.get_text() for label in axis.get_xticklabels()]
        assert labels and all(label.isdigit() for label in labels), (title, labels)  # whole epochs only
        assert block_starts(axis) == [1], title  # block 2 began after the first epoch
    curves = lines_labelled(axes["Validation mAP per epoch"])
    assert set(curves) == {f"mAP@{k}{ema}" for k in ("50:95", "50", "75") for ema in ("", ", EMA")}
    assert all(list(curve.get_xdata()) == [1, 2] for curve in curves.values())


def test_the_training_figure_of_one_epoch_reads_as_well(two_block_run):
    axes, records = drawn(two_block_run[0], ["block_01"])
    assert len(records) == 1 and all(block_starts(axis) == [] for axis in axes.values())
    loss = axes["Training loss per step"]
    assert loss.get_xlim() == (0, 1) and [label.get_text() for label in loss.get_xticklabels()] == ["0", "1"]


def test_the_training_figure_of_forty_epochs_in_four_blocks_stays_readable(two_block_run):
    """A full run's length: the real run's two epochs of records, repeated as 40 epochs in blocks of 10."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from rfdetr_coco_pipeline.plotting import join_metrics
    from rfdetr_coco_pipeline.training_figure import training_figure

    train = two_block_run[0] / "results" / "train"
    blocks = [train / "block_01", train / "block_02"]
    records = [record for block in blocks for record in json.loads((block / "epochs.json").read_text())]
    metrics = join_metrics([block / "metrics.csv" for block in blocks])
    forty = [{**records[epoch % 2], "epoch": epoch} for epoch in range(40)]
    rows = pd.concat([metrics[metrics["epoch"] == epoch % 2].assign(epoch=epoch) for epoch in range(40)])
    figure = training_figure(rows, forty, [(0, 10), (10, 20), (20, 30), (30, 40)])
    FigureCanvasAgg(figure).draw()
    axes = {axis.get_title(): axis for axis in figure.axes if axis.get_title()}
    for title, axis in axes.items():
        labels = [label.get_text() for label in axis.get_xticklabels() if label.get_text()]
        assert 3 <= len(labels) <= 11 and all(label.isdigit() for label in labels), (title, labels)  # not 40
        assert block_starts(axis) == [10, 20, 30], title
    steps = lines_labelled(axes["Training loss per step"])["each step"].get_xdata()
    assert len(steps) == sum(len(record["loss"]) for record in forty) and max(steps) == 40
    assert all(len(curve.get_xdata()) == 40 for curve in lines_labelled(axes["Validation mAP per epoch"]).values())


def test_metrics_have_train_and_val_rows_for_every_epoch_and_the_plots_are_pngs(two_block_run):
    workdir, _, _ = two_block_run
    metrics = pd.read_csv(workdir / "results" / "metrics.csv")
    assert sorted(metrics.dropna(subset=["train/loss"])["epoch"]) == [0, 1]
    assert sorted(metrics.dropna(subset=["val/mAP_50_95"])["epoch"]) == [0, 1]
    for plot in ("loss.png", "map.png"):
        with Image.open(workdir / "results" / "plots" / plot) as image:
            assert image.format == "PNG" and image.width > 200 and image.height > 200
    summary = (workdir / "results" / "plots" / "summary.txt").read_text()
    assert "Epochs trained: 2" in summary and "images/s" in summary
    best = re.search(r"Best val mAP@50:95: ([\d.]+) at epoch (\d+) \(epochs count from 0, as in metrics.csv\)", summary)
    assert best, summary
    # the best epoch is one of metrics.csv's rows with the highest mAP, by that row's own (0-based) epoch number
    val = metrics.dropna(subset=["val/mAP_50_95"])
    highest = val["val/mAP_50_95"].max()
    assert float(best[1]) == pytest.approx(highest, abs=5e-5)
    assert int(best[2]) in set(val.loc[val["val/mAP_50_95"] == highest, "epoch"])
    assert json.loads(summary[summary.index("{") :])["best_epoch"] == int(best[2])


def test_a_second_run_has_nothing_to_do(two_block_run, module_server):
    workdir, _, _ = two_block_run
    before = len(module_server.requests)
    result = run_snakemake(workdir)
    assert result.returncode == 0 and "Nothing to be done" in result.stdout
    assert jobs_run(result.stdout) == [] and len(module_server.requests) == before


@pytest.fixture(scope="module")
def uninterrupted_run_without_speedups(tmp_path_factory, module_server, archives):
    """The same 2 epochs as one block, with train.speedups: none (stock rfdetr), up to the block's outputs."""
    workdir = tmp_path_factory.mktemp("one_block_no_speedups")
    config = tiny_config(workdir, module_server.url, archives, epochs=2, epochs_per_block=2, speedups="none")
    write_config(workdir, config)
    result = run_snakemake(workdir, "results/train/block_01/checkpoint.ckpt")  # the block; its plot is not compared
    assert result.returncode == 0, result.stdout[-5000:]
    return workdir


def test_blocks_follow_the_learning_rate_schedule_of_one_uninterrupted_run(
    two_block_run, uninterrupted_run_without_speedups
):
    workdir, _, _ = two_block_run
    blocks = [
        json.loads((workdir / "results" / "train" / b / "epochs.json").read_text()) for b in ("block_01", "block_02")
    ]
    single_dir = uninterrupted_run_without_speedups / "results" / "train" / "block_01"
    single = json.loads((single_dir / "epochs.json").read_text())
    lr_blocks = [lr for block in blocks for epoch in block for lr in epoch["lr"]]
    lr_single = [lr for epoch in single for lr in epoch["lr"]]
    assert len(lr_single) == 10 and lr_blocks == lr_single  # exactly, step by step
    assert lr_single[5] > lr_single[-1] > 0  # warm-up, then cosine decay that really decays
    # the epoch log keeps every step's loss; the first block is the uninterrupted run's first epoch, step for step
    # (after a block boundary the new process draws another sample order, so later losses differ)
    loss_blocks = [loss for block in blocks for epoch in block for loss in epoch["loss"]]
    loss_single = [loss for epoch in single for loss in epoch["loss"]]
    assert len(loss_blocks) == len(loss_single) == 10
    assert loss_blocks[:5] == pytest.approx(loss_single[:5], rel=1e-5)
    weights = [
        torch.load(folder / "checkpoint.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        for folder in (workdir / "results" / "train" / "block_02", single_dir)
    ]
    floats = [name for name, tensor in weights[0].items() if tensor.is_floating_point()]
    diff = max((weights[0][n] - weights[1][n]).abs().max().item() for n in floats)
    scale = max(weights[0][n].abs().max().item() for n in floats)
    assert diff <= 1e-3 * scale, (diff, scale)


def test_without_speedups_the_train_rule_gives_the_notebooks_losses(
    uninterrupted_run_without_speedups, tiny_dataset, tmp_path
):
    """train.speedups: none is the notebook's training call: bench/stock_recipe.py, run on the same tiny set with the
    train rule's batch, resolution and loader workers, gives the same loss at every step, from the same random
    numbers."""
    workdir = uninterrupted_run_without_speedups
    run = json.loads((workdir / "results" / "train" / "block_01" / "run.json").read_text())
    assert run["speedups"] == [] and set(run["speedups_left_off"]) == set(NAMES)
    command = [sys.executable, "-m", "bench.stock_recipe", "--dataset", str(tiny_dataset), "--output", str(tmp_path)]
    command += ["--epochs", "2", "--batch", str(run["recipe"]["batch_size"]), "--resolution", "64", "--workers", "0"]
    command += ["--num-queries", str(run["recipe"]["num_queries"])]
    stock = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert stock.returncode == 0, stock.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "epochs.jsonl").read_text().splitlines()]
    workflow = json.loads((workdir / "results" / "train" / "block_01" / "epochs.json").read_text())
    assert [r["lr"] for r in records] == [r["lr"] for r in workflow]
    assert [r["loss"] for r in records] == [r["loss"] for r in workflow] and len(records[0]["loss"]) == 5
    # and draws the same random numbers: the generators' states agree at every epoch's start
    assert [r["rng_digests"] for r in records] == [r["rng_digests"] for r in workflow]
    assert records[0]["rng_digests"] != records[1]["rng_digests"]  # an epoch draws random numbers: the digest moves


def test_a_connection_dropped_mid_archive_refetches_only_the_rest_of_that_archive(workdir, server, archives):
    server.faults.once["train2017.zip"] = ["drop"] * 3  # every one of the 3 tries is cut
    target = "results/verify/dataset.json"
    failed = run_snakemake(workdir, target)
    assert failed.returncode != 0 and "Download failed after 3 tries" in failed.stdout
    part = workdir / "data" / "archives" / "train2017.zip.part"
    assert part.stat().st_size > 0  # the partial file survived the failed job
    result = run_snakemake(workdir, target)
    assert result.returncode == 0, result.stdout[-5000:]
    assert jobs_run(result.stdout) == ["download_archive", "extract_archive", "verify_counts"]
    resumed = server.gets("train2017.zip")[-1]
    assert resumed.range == f"bytes={part_size(server)}-" and resumed.status == 206
    assert len(server.gets("annotations_trainval2017.zip")) == 1 and len(server.gets("val2017.zip")) == 1


def part_size(server: ArchiveServer) -> int:
    return sum(r.bytes_sent for r in server.gets("train2017.zip")[:-1])


def test_a_corrupt_archive_is_kept_aside_and_fetched_again_when_asked_and_nothing_else_is(workdir, server, archives):
    server.faults.once["val2017.zip"] = ["corrupt"]  # one transfer goes wrong
    target = "results/verify/dataset.json"
    failed = run_snakemake(workdir, target)
    assert failed.returncode != 0
    assert f"val2017.zip: MD5 mismatch: expected {archives['val2017']['md5']}, got " in failed.stdout
    assert (workdir / "data" / "archives" / ".quarantine" / "val2017.zip").is_file()
    # the server describes the same file: no second download of what is probably a wrong md5 ...
    stopped = run_snakemake(workdir, target)
    assert stopped.returncode != 0 and "the server keeps sending the same content" in stopped.stdout
    kept = workdir / "data" / "archives" / ".quarantine" / "val2017.zip"
    assert f"delete {kept.relative_to(workdir)} to fetch once more anyway" in stopped.stdout
    assert len(server.gets("val2017.zip")) == 1
    # ... until asked for
    kept.unlink()  # as the message says
    result = run_snakemake(workdir, target)
    assert result.returncode == 0, result.stdout[-5000:]
    assert [r.range for r in server.gets("val2017.zip")] == [None, None]  # a fresh, whole download
    assert len(server.gets("annotations_trainval2017.zip")) == 1
    assert not (workdir / "data" / "archives" / ".quarantine" / "val2017.zip").exists()  # cleared once it matched


def test_the_evaluation_is_rfdetrs_coco_summary_and_per_class_ap_of_the_best_weights(two_block_run, tiny_dataset):
    workdir, _, _ = two_block_run
    metrics = json.loads((workdir / "results" / "eval" / "metrics.json").read_text())
    summary = ["AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large", "AR1", "AR10", "AR100"]
    assert all(-1 <= metrics[key] <= 1 for key in summary)  # COCO's -1: no ground truth of that size
    assert metrics["AP"] == metrics["rfdetr_returned"]["val/mAP_50_95"]  # the number rfdetr's evaluate() returned
    assert metrics["weights"] == "results/train/block_02/best.pth" and metrics["best_source"] in ("ema", "regular")
    assert metrics["images"] == 4 and metrics["max_detections"] == 100
    per_class = pd.read_csv(workdir / "results" / "eval" / "per_class.csv")
    annotations = json.loads((tiny_dataset / "annotations" / "instances_val2017.json").read_text())
    present = {a["category_id"] for a in annotations["annotations"]}
    assert set(per_class["category_id"]) == present and per_class["AP"].between(0, 1).all()
    names = {c["id"]: c["name"] for c in annotations["categories"]}
    assert all(names[cid] == name for cid, name in zip(per_class["category_id"], per_class["name"], strict=True))
    with Image.open(workdir / "results" / "eval" / "per_class.png") as image:
        assert image.format == "PNG" and image.height > 200


def test_the_exported_onnx_model_gives_the_pytorch_models_boxes_and_scores(two_block_run, tiny_dataset):
    """onnxruntime on a validation image against the PyTorch model rfdetr loads from the same best.pth: boxes and
    class scores agree to within 1e-4 (absolute; boxes are relative coordinates, scores probabilities)."""
    import numpy as np
    import onnxruntime
    from rfdetr.detr import RFDETR

    workdir, _, _ = two_block_run
    session = onnxruntime.InferenceSession(str(workdir / "results" / "export" / "model.onnx"))
    model = RFDETR.from_checkpoint(str(workdir / "results" / "train" / "block_02" / "best.pth"))
    size = model.model_config.resolution
    image = sorted((tiny_dataset / "val2017").glob("*.jpg"))[0]
    with Image.open(image) as picture:
        pixels = torch.from_numpy(np.asarray(picture.convert("RGB").resize((size, size)), dtype=np.float32) / 255)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    batch = ((pixels - mean) / std).permute(2, 0, 1).unsqueeze(0)
    boxes, logits = session.run(["dets", "labels"], {session.get_inputs()[0].name: batch.numpy()})
    with torch.no_grad():
        expected = model.model.model.eval()(batch)
    queries = json.loads((workdir / "results" / "train" / "block_02" / "run.json").read_text())["recipe"]["num_queries"]
    assert boxes.shape == tuple(expected["pred_boxes"].shape) == (1, queries, 4)  # the CPU profile's query count
    assert np.abs(boxes - expected["pred_boxes"].numpy()).max() < 1e-4
    scores = torch.sigmoid(torch.from_numpy(logits))
    assert (scores - expected["pred_logits"].sigmoid()).abs().max().item() < 1e-4


def test_the_best_weights_of_a_compiled_run_load_in_rfdetr(two_block_run, tmp_path):
    """rfdetr's EMA copies the Lightning module (`AveragedModel`), whose model a compiled run holds wrapped by
    torch.compile: its weights carry the wrapper's `_orig_mod.` names, which rfdetr's `from_checkpoint` cannot load.
    The train stage's copy of the best weights (`copy_best_weights`) loads, with the same values."""
    from rfdetr.detr import RFDETR
    from torch.optim.swa_utils import AveragedModel

    from rfdetr_coco_pipeline.training.resume import copy_best_weights

    workdir, _, _ = two_block_run
    best = workdir / "results" / "train" / "block_02" / "best.pth"
    model = RFDETR.from_checkpoint(str(best)).model.model
    lightning_module = torch.nn.Module()
    lightning_module.model = torch.compile(model)  # as rfdetr's module holds it when the GPU profile compiles
    compiled_weights = AveragedModel(lightning_module).module.model.state_dict()  # what rfdetr's EMA saves
    assert compiled_weights and all(name.startswith("_orig_mod.") for name in compiled_weights)
    checkpoint = torch.load(best, map_location="cpu", weights_only=False)
    checkpoint["model"] = compiled_weights
    torch.save(checkpoint, tmp_path / "checkpoint_best_total.pth")
    with pytest.raises(KeyError, match="class_embed.bias"):
        RFDETR.from_checkpoint(str(tmp_path / "checkpoint_best_total.pth"))

    assert copy_best_weights(tmp_path / "checkpoint_best_total.pth", tmp_path / "best.pth") == len(compiled_weights)
    loaded = RFDETR.from_checkpoint(str(tmp_path / "best.pth")).model.model.state_dict()
    expected = model.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)
    # weights without the prefix (this CPU run's) are copied as they are
    assert copy_best_weights(best, tmp_path / "copy.pth") == 0
    assert (tmp_path / "copy.pth").read_bytes() == best.read_bytes()


def test_a_compiled_runs_weights_load_for_inference_with_compile_and_cuda_graphs_off(two_block_run, tmp_path):
    """A compiled run's best.pth records `compile` and `cuda_graphs` in its model config; rfdetr's `from_checkpoint`
    restores them, and its `evaluate()` then compiles the module it builds before loading the weights (a RuntimeError
    on the GPU). The evaluate and export stages load the file with both off (`load_for_inference`), same weights."""
    from rfdetr.detr import RFDETR

    from rfdetr_coco_pipeline.training.rfdetr_call import load_for_inference

    workdir, _, _ = two_block_run
    checkpoint = torch.load(workdir / "results" / "train" / "block_02" / "best.pth", map_location="cpu")
    checkpoint["model_config"].update(compile=True, cuda_graphs=True)  # as the h200 row's best.pth records them
    torch.save(checkpoint, tmp_path / "compiled.pth")
    restored = RFDETR.from_checkpoint(str(tmp_path / "compiled.pth"))
    assert restored.model_config.compile and restored.model_config.cuda_graphs

    loaded = load_for_inference(tmp_path / "compiled.pth")
    assert not loaded.model_config.compile and not loaded.model_config.cuda_graphs
    expected, got = restored.model.model.state_dict(), loaded.model.model.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[name], expected[name]) for name in expected)


def test_without_the_onnx_extra_the_export_stops_naming_it(two_block_run, tmp_path):
    workdir, _, _ = two_block_run
    weights = workdir / "results" / "train" / "block_02" / "best.pth"
    site = tmp_path / "site"  # a Python where onnx does not import, as in an environment without the onnx extra
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['onnx'] = None\n")
    command = [sys.executable, str(REPO / "scripts" / "export.py"), "--weights", str(weights), "--format", "onnx"]
    result = subprocess.run(
        [*command, "--output", str(tmp_path / "model.onnx")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "pip install -e '.[onnx]'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "model.onnx").exists()


def test_tensorboard_shows_the_epochs_of_all_blocks_as_one_run(two_block_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir, _, _ = two_block_run
    run = json.loads((workdir / "results" / "train" / "block_02" / "run.json").read_text())
    state_dir = workdir / run["state_dir"]
    events = EventAccumulator(str(state_dir))  # one folder, one event file per block
    events.Reload()
    assert len(list(state_dir.glob("events.out.tfevents.*"))) == 2
    assert [e.value for e in events.Scalars("epoch")][::2] == [0, 1]
    assert len(events.Scalars("val/mAP_50_95")) == 2 and len(events.Scalars("train/loss")) == 2


def test_the_report_shows_the_epochs_the_evaluation_the_run_and_the_figures_in_a_browser(two_block_run, tmp_path):
    """`snakemake --report`, opened in a real headless Chromium: each page and figure shown as a person clicks it,
    from the menu and from the first page's links."""
    from selenium.webdriver.common.by import By

    from tests.helpers.browser import headless_chromium, install_chromium, wait_for

    workdir, _, _ = two_block_run
    result = run_snakemake(workdir, "--report", str(tmp_path / "report.html"))
    assert result.returncode == 0, result.stdout[-3000:]
    if reason := install_chromium():
        pytest.skip(reason)
    browser = headless_chromium()

    def show(category: str, name: str) -> None:
        browser.get((tmp_path / "report.html").as_uri())
        wait_for(lambda: [a for a in browser.find_elements(By.TAG_NAME, "a") if a.text.strip() == category])[0].click()
        row = wait_for(lambda: [r for r in browser.find_elements(By.TAG_NAME, "tr") if r.text.strip() == name])[0]
        row.find_element(By.CSS_SELECTOR, 'a[iconname="eye"]').click()
        browser.save_screenshot(str(tmp_path / f"{Path(name).name}.png"))  # kept when the test fails

    def figure_width() -> int:
        images = [i for i in browser.find_elements(By.TAG_NAME, "img") if "image/png" in (i.get_attribute("src") or "")]
        return int(images[0].get_attribute("naturalWidth") or 0) if images else 0

    def page_text() -> str:
        frame = wait_for(lambda: browser.find_elements(By.TAG_NAME, "iframe"))[0]
        browser.switch_to.frame(frame)
        text = wait_for(lambda: browser.find_element(By.TAG_NAME, "body").text)
        rows = len(browser.find_elements(By.CSS_SELECTOR, "tbody tr"))
        browser.switch_to.default_content()
        return f"{rows} rows\n{text}"

    def follow(link: str) -> None:
        """Opens a page through the first page's link to it, as a reader who never touches the menu does."""
        browser.get((tmp_path / "report.html").as_uri())
        wait_for(lambda: [a for a in browser.find_elements(By.TAG_NAME, "a") if a.text.strip() == link])[0].click()
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, 'a[iconname="eye"]'))[0].click()

    def front_page() -> tuple[str, int]:
        browser.get((tmp_path / "report.html").as_uri())
        text = wait_for(lambda: "Best validation" in browser.find_element(By.TAG_NAME, "body").text and browser)
        text = browser.find_element(By.TAG_NAME, "body").text
        browser.save_screenshot(str(tmp_path / "front.png"))
        return text, wait_for(figure_width)

    try:
        first_page, first_figure = front_page()
        widths = {}
        for category, name in [
            ("Training", "results/plots/loss.png"),
            ("Training", "results/plots/map.png"),
            ("Evaluation", "results/eval/per_class.png"),
        ]:
            show(category, name)
            widths[name] = wait_for(figure_width)
        follow("the epochs one by one")
        epochs = page_text()
        follow("AP and AR per category")
        evaluation = page_text()
        follow("the run's settings and versions")
        run = page_text()
        show("Run", "results/report/run.html")  # the same page through the menu
        assert page_text() == run
    finally:
        browser.quit()
    assert all(width > 200 for width in widths.values()), widths
    # the first page opens on the answer: the headline as summary.txt and metrics.json have it, and the figure
    text = (workdir / "results" / "plots" / "summary.txt").read_text()
    summary = json.loads(text[text.index("{") :])
    coco = json.loads((workdir / "results" / "eval" / "metrics.json").read_text())
    headline = f"Best validation mAP@50:95: {summary['best_map_50_95']:.3f} at epoch {summary['best_epoch']}"
    assert headline in first_page and f"Trained {summary['epochs_trained']} epochs" in first_page
    assert f"(GPU profile {summary['gpu_profile']})" in first_page
    shown = [f"{coco[key]:.3f}" if coco[key] >= 0 else "–" for key in ("AP", "AP50", "AP75", "AP_small")]
    assert "AP AP50 AP75 AP small" in first_page.replace("\n", " ")
    assert " ".join(shown) in first_page.replace("\n", " "), first_page
    assert first_figure > 1000  # the training figure, at its full width
    assert epochs.startswith("2 rows") and "val mAP@50:95" in epochs and "images/s" in epochs
    assert "AP50" in evaluation and "AR100" in evaluation and "AP@50:95 per category" in evaluation
    versions = json.loads((workdir / "results" / "train" / "block_02" / "run.json").read_text())["versions"]
    # the software the training job ran with: this environment's; what is not here (an NVIDIA driver on a machine
    # without one, Transformer Engine when not installed) is null in run.json and an empty value on the page
    assert versions == {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # the CUDA torch was built with, also on a machine without a GPU
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
        "nvidia_driver": nvidia_driver_here(),
        "rfdetr": metadata.version("rfdetr"),
        "snakemake": metadata.version("snakemake"),
        "pytorch_lightning": metadata.version("pytorch-lightning"),
        "transformer_engine": installed("transformer-engine") or installed("transformer_engine"),
    }
    for name, version in versions.items():
        assert re.search(rf"^{name}\s*{re.escape(version or '')}$", run, re.M), (name, version, run)
    assert "cpu" in run


def nvidia_driver_here() -> str | None:
    """The loaded NVIDIA kernel module's version, as the kernel reports it; None without one."""
    version = Path("/proc/driver/nvidia/version")
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d[\d.]*)", version.read_text()) if version.exists() else None
    return found[1] if found else None


def installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def test_a_report_before_the_run_has_finished_is_refused_naming_a_missing_file(workdir):
    result = run_snakemake(workdir, "--report", "report.html")
    assert result.returncode != 0 and not (workdir / "report.html").exists()
    assert re.search(r"File results/\S+ marked for report but does not exist", result.stdout)


def test_a_damaged_in_progress_checkpoint_is_kept_aside_and_the_block_resumes_from_the_previous_blocks(
    two_block_run, tmp_path, module_server, archives
):
    """`last.ckpt` cut to half its size, as a full disk or a node lost mid-write leaves it, after block 2 trained but
    before its outputs were written: the next run keeps the damaged file aside, says so, and trains block 2 again
    from block 1's checkpoint; every later run is unaffected by it. (The runs ask for block 2's checkpoint: what
    follows it, evaluated and exported again, is the same as in the module's run.)"""
    workdir = tmp_path / "run"
    shutil.copytree(two_block_run[0], workdir, symlinks=True)
    shutil.rmtree(workdir / "results" / "train" / "block_02")
    write_config(workdir, tiny_config(workdir, module_server.url, archives, epochs=2, epochs_per_block=1))
    state = workdir / json.loads((two_block_run[0] / "results/train/block_02/run.json").read_text())["state_dir"]
    last = state / "last.ckpt"
    cut = last.read_bytes()[: last.stat().st_size // 2]
    last.write_bytes(cut)

    block_2 = "results/train/block_02/checkpoint.ckpt"
    result = run_snakemake(workdir, block_2)
    assert result.returncode == 0, result.stdout[-5000:]
    assert jobs_run(result.stdout).count("train_block") == 1  # block 2 only
    (damaged,) = state.glob("last.damaged-*.ckpt")
    assert damaged.read_bytes() == cut  # kept as it was found, for the user to look at
    log = (workdir / "results" / "logs" / "train" / "block_02.log").read_text()
    assert f"The in-progress checkpoint {last.relative_to(workdir)} does not load" in log
    assert f"kept aside as {damaged.name}" in log and "resuming from the previous block's checkpoint" in log
    run = json.loads((workdir / "results" / "train" / "block_02" / "run.json").read_text())
    assert run["resumed_from"].endswith("block_01/checkpoint.ckpt")
    checkpoint = torch.load(workdir / "results/train/block_02/checkpoint.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["epoch"] == 1
    again = run_snakemake(workdir, block_2)
    assert again.returncode == 0 and jobs_run(again.stdout) == []


def test_a_block_never_resumes_a_checkpoint_made_under_another_recipe(two_block_run, tmp_path, module_server, archives):
    # a copy of the module's run, with its second block to be trained again (block 1 stays as trained)
    workdir = tmp_path / "run"
    shutil.copytree(two_block_run[0], workdir, symlinks=True)
    shutil.rmtree(workdir / "results" / "train" / "block_02")
    config = tiny_config(workdir, module_server.url, archives, epochs=2, epochs_per_block=1)
    # the GPU profile is resolved when a job runs: here the next block finds another batch size
    next(p for p in config["gpu_profiles"] if p["name"] == "cpu")["batch_size"] = 4
    write_config(workdir, config)
    refused = run_snakemake(workdir)
    assert refused.returncode != 0
    assert "was trained under another recipe (batch_size: 2 -> 4)" in refused.stdout and "--forcerun" in refused.stdout
    assert jobs_run(refused.stdout) == []  # nothing before block 2 ran again
    assert not (workdir / "results" / "train" / "block_02" / "checkpoint.ckpt").exists()

"""Fault injection against the real workflow's downloads and data stages: real snakemake, a real HTTP server on
127.0.0.1, real files, processes and signals. Each fault is either survived (the next run, with any flag the README
names, completes and no finished archive is fetched again) or refused (the run stops before harm is done, says what
is wrong and what to do, and leaves no half-written file that looks finished). Training's faults are in
test_training_faults.py; docs/faults.md tells users what each fault does and what to type."""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.data.dataset import MARKER
from tests.helpers.archive_server import ArchiveServer
from tests.helpers.tiny_coco import make_archives, make_split, md5
from tests.helpers.workflow import (
    BLOCK,
    VERIFIED,
    jobs_run,
    kill_group,
    rerun_after_a_kill,
    run_snakemake,
    start_snakemake,
    times_fetched,
    tiny_config,
    wait_for_file,
    wait_for_job,
    write_config,
)

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------------------ network ----


def test_an_unreachable_server_stops_the_download_then_a_rerun_completes(workdir, server, archives, closed_port):
    config = tiny_config(workdir, server.url, archives)
    good_url = config["archives"]["val2017"]["url"]
    config["archives"]["val2017"]["url"] = f"http://127.0.0.1:{closed_port}/val2017.zip"
    write_config(workdir, config)
    failed = run_snakemake(workdir, VERIFIED)
    assert failed.returncode != 0 and "Download failed after 3 tries: no connection to 127.0.0.1" in failed.stdout
    assert "Nothing was downloaded" in failed.stdout and "partial file" not in failed.stdout
    assert failed.stdout.count("Try 1 of 3 failed") == 1  # each line once: not again in a dump of the job's log
    assert (workdir / "data" / "coco2017" / "annotations").is_dir()
    config["archives"]["val2017"]["url"] = good_url  # the network is back
    write_config(workdir, config)
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-3000:]
    assert times_fetched(server, "annotations_trainval2017") == 1 and times_fetched(server, "val2017") == 1


def test_a_wrong_md5_costs_one_download_not_one_per_run(workdir, server, archives):
    config = tiny_config(workdir, server.url, archives)
    config["archives"]["val2017"]["md5"] = "0" * 32  # the server's file is right; the setting is not
    write_config(workdir, config)
    first = run_snakemake(workdir, VERIFIED)
    assert first.returncode != 0 and "MD5 mismatch" in first.stdout and times_fetched(server, "val2017") == 1
    for _ in range(2):  # every later run stops before fetching, naming both sums
        again = run_snakemake(workdir, VERIFIED)
        assert again.returncode != 0 and times_fetched(server, "val2017") == 1
        got = archives["val2017"]["md5"]
        assert f"has MD5 {got}, and archives.val2017.md5 in config.yaml says {'0' * 32}" in again.stdout
        assert "the configured md5 is probably wrong" in again.stdout
        kept = workdir / "data" / "archives" / ".quarantine" / "val2017.zip"
        assert f"delete {kept.relative_to(workdir)} to fetch once more anyway" in again.stdout
    kept.unlink()  # as the message says
    forced = run_snakemake(workdir, VERIFIED)
    assert forced.returncode != 0 and times_fetched(server, "val2017") == 2  # fetched again, as asked
    config["archives"]["val2017"]["md5"] = archives["val2017"]["md5"]  # the fix
    write_config(workdir, config)
    fixed = run_snakemake(workdir, VERIFIED)
    assert fixed.returncode == 0, fixed.stdout[-3000:]


def test_a_connection_dropped_once_is_resumed_within_the_same_run(workdir, server):
    server.faults.once["train2017.zip"] = ["drop"]
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-3000:]
    first, second = server.gets("train2017.zip")
    assert first.range is None and second.range == f"bytes={first.bytes_sent}-" and second.status == 206


def test_a_server_that_ignores_range_gets_a_clean_restart_of_that_file(workdir, server):
    server.faults.once["train2017.zip"] = ["drop"]
    server.faults.ignore_range = True
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-3000:]
    first, second = server.gets("train2017.zip")
    assert second.range is not None and second.status == 200  # asked to resume, sent the whole file
    assert "restarting" in (workdir / "results" / "logs" / "download" / "train2017.log").read_text()


@pytest.mark.parametrize(("status", "message", "requests"), [(404, "HTTP 404", 1), (500, "HTTP 500", 3)])
def test_http_errors_stop_with_a_clear_message_after_bounded_retries(workdir, server, status, message, requests):
    server.faults.status["val2017.zip"] = status
    failed = run_snakemake(workdir, VERIFIED)
    assert failed.returncode != 0 and message in failed.stdout
    assert len([r for r in server.requests if r.name == "val2017.zip"]) == requests
    del server.faults.status["val2017.zip"]
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-3000:]
    assert times_fetched(server, "annotations_trainval2017") == 1


def test_a_server_error_answering_the_get_is_retried_and_the_tries_are_counted(workdir, server):
    """The HEAD succeeds and the GETs fail (a busy server): each failed GET is a try; two fail, the third completes."""
    server.faults.once["val2017.zip"] = ["503", "503"]
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-3000:]
    assert [r.status for r in server.gets("val2017.zip")] == [503, 503, 200]
    log = (workdir / "results" / "logs" / "download" / "val2017.log").read_text()
    assert "Try 1 of 3 failed" in log and "Try 2 of 3 failed" in log and "HTTP 503" in log


def test_a_server_error_on_every_get_stops_after_the_configured_tries(workdir, server):
    server.faults.once["val2017.zip"] = ["503"] * 3
    failed = run_snakemake(workdir, VERIFIED)
    assert failed.returncode != 0 and "Download failed after 3 tries" in failed.stdout and "HTTP 503" in failed.stdout
    assert [r.status for r in server.gets("val2017.zip")] == [503, 503, 503]  # 3 tries: download.attempts
    result = run_snakemake(workdir, VERIFIED)  # the server is well again
    assert result.returncode == 0, result.stdout[-3000:]


# ------------------------------------------------------------------------------------------ disk and data ----


def test_not_enough_disk_is_refused_before_anything_is_fetched(tmp_path, server, archives, small_tmpfs):
    disk = small_tmpfs("disk", "64k")
    config = tiny_config(tmp_path, server.url, archives)
    config["data_dir"] = str(disk)
    config["archives"]["train2017"]["extracted_bytes"] = 10**6  # more than the small disk holds
    write_config(tmp_path, config)
    failed = run_snakemake(tmp_path, VERIFIED)
    assert failed.returncode != 0 and "Not enough free disk" in failed.stdout and "but only" in failed.stdout
    assert [r for r in server.requests if r.method == "GET"] == []
    assert not [p for p in disk.rglob("*.zip*") if not p.name.endswith(".lock")]  # neither an archive nor a part


def serve_variant(tmp_path: Path, tiny_dataset: Path, change) -> tuple[ArchiveServer, dict]:
    """Archives of a changed copy of the dataset (their MD5s match: what the server sends is what was made)."""
    source = Path(shutil.copytree(tiny_dataset, tmp_path / "variant"))
    change(source)
    return ArchiveServer(tmp_path / "served"), make_archives(source, tmp_path / "served")


def test_a_truncated_archive_is_refused_at_extraction(tmp_path, tiny_dataset):
    served, archives = serve_variant(tmp_path, tiny_dataset, lambda root: None)
    data = archives["train2017"]["path"].read_bytes()
    archives["train2017"]["path"].write_bytes(data[: len(data) // 2])
    archives["train2017"]["md5"] = md5(archives["train2017"]["path"])
    with served:
        write_config(tmp_path, tiny_config(tmp_path, served.url, archives))
        failed = run_snakemake(tmp_path, VERIFIED)
    assert failed.returncode != 0 and "is not a readable zip archive" in failed.stdout
    assert "Delete it and run snakemake again" in failed.stdout
    assert not (tmp_path / "data" / "coco2017" / "train2017").exists()


def add_member(archive: Path, name: str, data: bytes = b"x", link: bool = False) -> None:
    with zipfile.ZipFile(archive, "a") as zf:
        info = zipfile.ZipInfo(name)
        if link:
            info.external_attr = 0o120777 << 16
        zf.writestr(info, data)


@pytest.mark.parametrize(
    ("member", "link", "reason"),
    [
        ("val2017/../../../escaped.txt", False, "contains '..'"),
        ("/tmp/escaped.txt", False, "an absolute path"),
        ("val2017/link.jpg", True, "a symbolic link"),
    ],
)
def test_archive_members_that_would_escape_are_refused(tmp_path, tiny_dataset, member, link, reason):
    served, archives = serve_variant(tmp_path, tiny_dataset, lambda root: None)
    add_member(archives["val2017"]["path"], member, b"/etc/passwd" if link else b"x", link)
    archives["val2017"]["md5"] = md5(archives["val2017"]["path"])
    with served:
        write_config(tmp_path, tiny_config(tmp_path, served.url, archives))
        failed = run_snakemake(tmp_path, VERIFIED)
    assert failed.returncode != 0 and "Refusing to extract" in failed.stdout and reason in failed.stdout
    assert not (tmp_path / "data" / "coco2017" / "val2017").exists()
    assert not list(tmp_path.rglob("escaped.txt")) and not Path("/tmp/escaped.txt").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda root: (root / "annotations" / "instances_val2017.json").unlink(), "instances_val2017.json is missing"),
        (
            lambda root: (root / "annotations" / "instances_train2017.json").write_text("{not json"),
            "instances_train2017.json is not valid JSON",
        ),
    ],
    ids=["annotation-missing", "annotation-not-json"],
)
def test_a_bad_annotation_file_is_named_by_the_verify_stage(tmp_path, tiny_dataset, change, message):
    served, archives = serve_variant(tmp_path, tiny_dataset, change)
    with served:
        write_config(tmp_path, tiny_config(tmp_path, served.url, archives))
        failed = run_snakemake(tmp_path, VERIFIED)
    assert failed.returncode != 0 and message in failed.stdout and "--forcerun" in failed.stdout
    assert not (tmp_path / VERIFIED).exists()


def test_a_corrupt_jpeg_is_named_and_the_suggested_command_fetches_only_its_archive(workdir, server):
    assert run_snakemake(workdir, VERIFIED).returncode == 0
    victim = sorted((workdir / "data" / "coco2017" / "val2017").glob("*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[:200])  # a disk that lost the end of a file
    (workdir / VERIFIED).unlink()
    failed = run_snakemake(workdir, VERIFIED)
    assert failed.returncode != 0 and f"val2017: 1 image(s) do not decode: {victim.name}" in failed.stdout
    suggested = failed.stdout.split("snakemake --cores all ")[1].split(" (and")[0].split()
    result = run_snakemake(workdir, VERIFIED, *suggested)
    assert result.returncode == 0, result.stdout[-3000:]
    assert (
        times_fetched(server, "val2017") == 2
        and times_fetched(server, "train2017") == 1
        and times_fetched(server, "annotations_trainval2017") == 1
    )


def test_image_files_the_annotations_do_not_list_stop_the_run_until_told_to_warn(workdir, server, archives):
    assert run_snakemake(workdir, VERIFIED).returncode == 0
    val = workdir / "data" / "coco2017" / "val2017"
    shutil.copy(sorted(val.glob("*.jpg"))[0], val / "stray.jpg")  # counted, but not in instances_val2017.json
    (workdir / VERIFIED).unlink()
    config = tiny_config(workdir, server.url, archives)
    config["verify"]["expected_images"]["val2017"] = 5
    write_config(workdir, config)
    failed = run_snakemake(workdir, VERIFIED)
    assert failed.returncode != 0 and "val2017: 1 image file(s)" in failed.stdout and "stray.jpg" in failed.stdout
    config["verify"]["unlisted_images"] = "warn"
    write_config(workdir, config)
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-3000:]
    assert jobs_run(result.stdout) == ["verify_counts"] and "stray.jpg" in result.stdout
    report = json.loads((workdir / VERIFIED).read_text())["splits"]["val2017"]
    assert (report["images"], report["annotated_images"], report["unlisted_images"]) == (5, 4, 1)


def test_image_counts_off_by_one_stop_the_run_and_a_fixed_config_reruns_only_the_check(workdir, server, archives):
    config = tiny_config(workdir, server.url, archives)
    config["verify"]["expected_images"]["val2017"] = 5
    write_config(workdir, config)
    failed = run_snakemake(workdir, VERIFIED)
    assert failed.returncode != 0 and "val2017: found 4 images" in failed.stdout and "expected 5" in failed.stdout
    config["verify"]["expected_images"]["val2017"] = 4
    write_config(workdir, config)
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0 and jobs_run(result.stdout) == ["verify_counts"]


# -------------------------------------------------------------------------------------------- processes ----


def test_sigkill_of_snakemake_mid_download_resumes_the_part_file(workdir, server, archives):
    server.faults.once["train2017.zip"] = ["slow"]  # so the kill lands while the archive is still arriving
    snakemake = start_snakemake(workdir, VERIFIED)
    wait_for_job(snakemake, "scripts/download.py --archive train2017")
    part = wait_for_file(snakemake, "train2017.zip.part", workdir / "data" / "archives")
    while part.stat().st_size < 1024 and snakemake.poll() is None:  # some bytes have arrived
        time.sleep(0.05)
    kill_group(snakemake)
    rerun_after_a_kill(workdir, VERIFIED)
    assert (workdir / VERIFIED).is_file()
    assert times_fetched(server, "train2017") == 2 and times_fetched(server, "val2017") == 1
    assert (server.gets("train2017.zip")[1].range or "").startswith("bytes=")  # the .part file was resumed


PADDING = "zz-padding.bin"  # a large file in train2017: work to be killed in the middle of


VAL_IMAGES = {"extract": 4, "verify": 3000, "stage": 4}  # verification decodes the images: 3,000 take a while


@pytest.fixture(scope="module")
def large_archives(tmp_path_factory: pytest.TempPathFactory, tiny_dataset: Path) -> dict[int, dict[str, dict]]:
    """The tiny dataset with work enough for a kill to land in the middle of a step: a 192 MiB file in train2017
    (extraction and staging write it for a while), with the 4 validation images or 3,000, by how many."""
    root = tmp_path_factory.mktemp("large")
    variants = {}
    for images in sorted(set(VAL_IMAGES.values())):
        dataset = Path(shutil.copytree(tiny_dataset, root / f"dataset-{images}"))
        make_split(dataset, "val2017", images, seed=2)
        (dataset / "train2017" / PADDING).write_bytes(os.urandom(192 << 20))
        variants[images] = make_archives(dataset, root / f"served-{images}")
    return variants


@pytest.mark.parametrize("stage", ["extract", "verify", "stage"])
def test_sigkill_of_snakemake_in_the_middle_of_a_data_stage_is_survived(tmp_path, large_archives, stage):
    """Snakemake and its job killed while the step's half-finished state is on disk (extraction's scratch folder,
    the RAM-disk copy's partial folder) or while it works (verification, between its splits): that state is never
    taken for finished, the next run redoes the step, and no archive is fetched again."""
    archives = large_archives[VAL_IMAGES[stage]]
    with ArchiveServer(next(iter(archives.values()))["path"].parent) as server:
        config = tiny_config(tmp_path, server.url, archives, epochs=1)
        config["verify"]["expected_images"]["val2017"] = VAL_IMAGES[stage]
        write_config(tmp_path, config)
        target = BLOCK if stage == "stage" else VERIFIED  # staging runs in the training job
        snakemake = start_snakemake(tmp_path, target)
        dataset, shm = tmp_path / "data" / "coco2017", tmp_path / "shm"
        if stage == "extract":
            half = wait_for_file(snakemake, f".extracting-train2017/train2017/{PADDING}", dataset, every=0.002)
        elif stage == "stage":
            half = wait_for_file(snakemake, f".*.partial/train2017/{PADDING}", shm, every=0.002)
        else:
            log = tmp_path / "results" / "logs" / "verify" / "dataset.log"
            deadline = time.time() + 600
            while not (log.is_file() and "train2017: 8 image files" in log.read_text()):
                assert snakemake.poll() is None and time.time() < deadline, "verification never got there"
                time.sleep(0.002)
        kill_group(snakemake)
        if stage == "extract":  # killed mid-write: the half-made folder is the scratch one, not train2017
            assert half.stat().st_size < 192 << 20 and not (dataset / "train2017").exists()
        elif stage == "stage":  # a partial copy without the marker of a complete one
            assert half.stat().st_size < 192 << 20 and not list(shm.glob(f"*/{MARKER}"))
        else:  # killed between its splits: no report
            assert not (tmp_path / VERIFIED).exists()
        output = rerun_after_a_kill(tmp_path, target)
        assert all(times_fetched(server, name) == 1 for name in archives)
        if stage == "extract":
            assert (dataset / "train2017" / PADDING).stat().st_size == 192 << 20
            assert not list(dataset.glob(".extracting-*"))
        if stage == "stage":
            staged = json.loads((tmp_path / "results" / "train" / "block_01" / "stage.json").read_text())
            assert staged["where"] == "ramdisk" and staged["reason"] == "copied"  # made afresh, the partial never used
            assert staged["bytes"] > 192 << 20 and not list(shm.glob(".*.partial"))
            assert "train_block" in jobs_run(output)
        report = json.loads((tmp_path / VERIFIED).read_text())
        assert report["splits"]["val2017"]["images"] == VAL_IMAGES[stage]


def test_a_second_invocation_in_the_same_folder_is_refused_while_the_first_runs(workdir, server):
    server.faults.once["train2017.zip"] = ["slow"]
    server.faults.slow_seconds = 60  # the first run holds its lock until the second one has been answered
    first = start_snakemake(workdir, VERIFIED)
    wait_for_job(first, "scripts/download.py --archive train2017")
    second = run_snakemake(workdir, VERIFIED)
    server.faults.release.set()  # the rest of the archive at once
    assert second.returncode != 0 and "Directory cannot be locked" in second.stdout
    assert first.wait(timeout=300) == 0  # the first run was not disturbed
    assert times_fetched(server, "train2017") == 1

"""The download stage against a real HTTP server on 127.0.0.1: resume, retries, checksums, disk check."""

from __future__ import annotations

import hashlib
import re
import socket
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.data.download import download, later_needs, part_path
from rfdetr_coco_pipeline.settings import Archive
from tests.helpers.archive_server import ArchiveServer

FAST = dict(attempts=3, backoff_seconds=0.05, max_backoff_seconds=0.1, timeout=5)


def fetch(server: ArchiveServer, archives: dict, name: str, dest: Path, **kwargs) -> Path:
    output = dest / f"{name}.zip"
    download(f"{server.url}/{name}.zip", output, archives[name]["md5"], **{**FAST, **kwargs})
    return output


def test_download_writes_the_archive_once_its_md5_matches(server, archives, tmp_path):
    output = fetch(server, archives, "val2017", tmp_path)
    assert output.read_bytes() == archives["val2017"]["path"].read_bytes()
    assert not part_path(output).exists()
    assert [r.range for r in server.gets("val2017.zip")] == [None]


def test_a_dropped_connection_is_resumed_with_a_range_request(server, archives, tmp_path):
    server.faults.once["train2017.zip"] = ["drop"]
    output = fetch(server, archives, "train2017", tmp_path)
    assert hashlib.md5(output.read_bytes()).hexdigest() == archives["train2017"]["md5"]
    first, second = server.gets("train2017.zip")
    assert first.range is None and first.bytes_sent < archives["train2017"]["size"]
    assert second.range == f"bytes={first.bytes_sent}-" and second.status == 206
    assert first.bytes_sent + second.bytes_sent == archives["train2017"]["size"]


def test_a_partial_file_left_by_a_killed_job_is_resumed(server, archives, tmp_path):
    data = archives["val2017"]["path"].read_bytes()
    part_path(tmp_path / "val2017.zip").write_bytes(data[:1000])
    fetch(server, archives, "val2017", tmp_path)
    (only,) = server.gets("val2017.zip")
    assert only.range == "bytes=1000-" and only.bytes_sent == len(data) - 1000


def test_a_server_that_ignores_range_restarts_the_file_cleanly(server, archives, tmp_path):
    data = archives["val2017"]["path"].read_bytes()
    part_path(tmp_path / "val2017.zip").write_bytes(b"stale bytes that must not survive")
    server.faults.ignore_range = True
    output = fetch(server, archives, "val2017", tmp_path)
    assert output.read_bytes() == data
    (only,) = server.gets("val2017.zip")
    assert only.status == 200 and only.range is not None


def test_corrupt_content_is_an_md5_error_naming_the_file_and_both_sums(server, archives, tmp_path):
    server.faults.once["val2017.zip"] = ["corrupt"]
    with pytest.raises(StageError) as error:
        fetch(server, archives, "val2017", tmp_path)
    message = str(error.value)
    sums = re.findall(r"\b[0-9a-f]{32}\b", message)
    assert "val2017.zip" in message and sums[0] == archives["val2017"]["md5"]
    assert len(sums) == 2 and sums[1] != sums[0]
    assert not (tmp_path / "val2017.zip").exists() and not part_path(tmp_path / "val2017.zip").exists()
    assert (tmp_path / ".quarantine" / "val2017.zip").is_file()  # kept aside, not where a finished archive goes
    with pytest.raises(StageError, match="the server keeps sending the same content") as again:
        fetch(server, archives, "val2017", tmp_path)  # the server describes the same file: no second download
    assert len(server.gets("val2017.zip")) == 1
    kept = tmp_path / ".quarantine" / "val2017.zip"
    assert f"delete {kept} to fetch once more anyway" in str(again.value)
    kept.unlink()  # as the message says
    fetch(server, archives, "val2017", tmp_path)  # fetched afresh, and right this time
    assert [r.range for r in server.gets("val2017.zip")] == [None, None]
    assert not (tmp_path / ".quarantine" / "val2017.zip").exists()


def test_http_500_is_retried_a_bounded_number_of_times_then_reported(server, archives, tmp_path):
    server.faults.status["val2017.zip"] = 500
    with pytest.raises(StageError, match=r"failed after 3 tries: .*HTTP 500"):
        fetch(server, archives, "val2017", tmp_path)
    assert len([r for r in server.requests if r.name == "val2017.zip"]) == 3


def test_http_404_fails_at_once_with_a_hint_about_the_url(server, archives, tmp_path):
    with pytest.raises(StageError, match=r"HTTP 404.*archives.<name>.url"):
        download(f"{server.url}/nope.zip", tmp_path / "nope.zip", "0" * 32, **FAST)
    assert len(server.requests) == 1


def test_an_unreachable_server_is_reported_after_bounded_retries(tmp_path, closed_port):
    with pytest.raises(StageError, match=r"failed after 3 tries.*run snakemake again"):
        download(f"http://127.0.0.1:{closed_port}/val2017.zip", tmp_path / "val2017.zip", "0" * 32, **FAST)


def test_not_enough_disk_is_refused_before_any_byte_is_fetched(server, archives, small_tmpfs):
    disk = small_tmpfs("disk", "64k")
    with pytest.raises(StageError) as error:
        fetch(server, archives, "train2017", disk, extracted_bytes=10**6)
    message = str(error.value)
    assert re.search(r"need \S+ [KMG]iB .* only \S+ [KMG]iB is free", message) and "data_dir" in message
    assert server.gets("train2017.zip") == []
    assert list(disk.iterdir()) == []


def test_later_needs_counts_the_largest_later_archive_unless_archives_are_kept():
    sizes = {"a": (1, 10), "b": (100, 1000), "c": (50, 500)}
    archives = [
        Archive(name=name, url="http://x/", md5="0" * 32, folder=name, size_bytes=size, extracted_bytes=extracted)
        for name, (size, extracted) in sizes.items()
    ]
    assert later_needs(archives, "a", keep_archives=False) == 1000 + 500 + 100
    assert later_needs(archives, "a", keep_archives=True) == 1000 + 500 + 100 + 50
    assert later_needs(archives, "c", keep_archives=False) == 0


def test_a_host_whose_name_does_not_resolve_is_named_as_such():
    """The exception chain requests raises when a host name does not resolve (built as urllib3 builds it, so the
    test sends no DNS query): the message names the host and why."""
    import requests
    import urllib3

    from rfdetr_coco_pipeline.data.download import connection_problem

    url = "http://images.cocodataset.example/zips/val2017.zip"
    unresolved = urllib3.exceptions.NameResolutionError("images.cocodataset.example", None, socket.gaierror(-2, "x"))
    error = requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, url, reason=unresolved))
    error.__cause__ = error.args[0]
    assert connection_problem(url, error) == "no connection to images.cocodataset.example (its name does not resolve)"


def test_a_failed_download_says_whether_anything_was_kept(server, archives, tmp_path, closed_port):
    with pytest.raises(StageError) as refused:
        download(
            f"http://127.0.0.1:{closed_port}/val2017.zip", tmp_path / "val2017.zip", "0" * 32, **FAST, archive="val2017"
        )
    message = str(refused.value)
    assert "no connection to 127.0.0.1 (the connection was refused)" in message
    assert "Check the network, or archives.val2017.url in config.yaml" in message
    assert "Nothing was downloaded" in message and "partial file" not in message
    assert not list(tmp_path.iterdir())  # as it says

    server.faults.once["train2017.zip"] = ["drop"] * 3  # every try is cut after some bytes
    with pytest.raises(StageError) as cut:
        fetch(server, archives, "train2017", tmp_path)
    kept = part_path(tmp_path / "train2017.zip")
    assert f"The partial file {kept} (" in str(cut.value) and kept.stat().st_size > 0

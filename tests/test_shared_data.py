"""Data the workflow shares or did not make: two runs on one data_dir started together, an archive placed by hand, and
a file system that cannot lock. Each runs the real workflow against the local HTTP server."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.workflow import VERIFIED, run_snakemake, start_snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow


NO_LOCKS = r"""
/* Locks refused under one folder, as NFS without its lock daemon refuses them: flock() and fcntl() locks on files
   below $NO_LOCKS_UNDER fail with ENOLCK; everything else goes to the C library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int refused(int fd) {
    const char *root = getenv("NO_LOCKS_UNDER");
    char link[64], path[4096];
    if (!root) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    return strncmp(path, root, strlen(root)) == 0;
}

static int is_lock(int cmd) {
    return cmd == F_SETLK || cmd == F_SETLKW || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW;
}

int flock(int fd, int op) {
    static int (*real)(int, int);
    if (refused(fd)) { errno = ENOLCK; return -1; }
    if (!real) real = dlsym(RTLD_NEXT, "flock");
    return real(fd, op);
}

#define FORWARD(name)                                                   \
int name(int fd, int cmd, ...) {                                        \
    static int (*real)(int, int, ...);                                  \
    va_list args; va_start(args, cmd); void *arg = va_arg(args, void *); va_end(args); \
    if (is_lock(cmd) && refused(fd)) { errno = ENOLCK; return -1; }     \
    if (!real) real = dlsym(RTLD_NEXT, #name);                          \
    return real(fd, cmd, arg);                                          \
}
FORWARD(fcntl)
FORWARD(fcntl64)
"""


def shared_config(workdir: Path, data: Path, server_url: str, archives: dict) -> None:
    workdir.mkdir()
    config = tiny_config(workdir, server_url, archives)
    config.update(data_dir=str(data))
    config["extract"]["keep_archives"] = True  # so that a late run always finds the first one's download
    write_config(workdir, config)


def log_text(workdir: Path, *parts: str) -> str:
    path = workdir.joinpath("results", "logs", *parts)
    return path.read_text() if path.is_file() else ""


def test_two_runs_sharing_data_dir_started_together_fetch_and_extract_each_archive_once(tmp_path, server, archives):
    data = tmp_path / "shared-data"
    runs = [tmp_path / "first", tmp_path / "second"]
    for workdir in runs:
        shared_config(workdir, data, server.url, archives)
    # Each archive's first transfer is held until both runs are at the first download, so that they overlap.
    server.faults.slow_seconds = 300
    server.faults.once = {f"{name}.zip": ["slow"] for name in archives}
    first_archive = next(iter(archives))
    started = [start_snakemake(workdir, VERIFIED, name="run") for workdir in runs]
    try:
        deadline = time.time() + 300
        while not any("Waiting for another run" in log_text(w, "download", f"{first_archive}.log") for w in runs):
            assert all(s.poll() is None for s in started) and time.time() < deadline, "no run waited for the other"
            time.sleep(0.2)
        server.faults.release.set()
        codes = [s.wait(timeout=600) for s in started]
    finally:
        for s in started:
            if s.poll() is None:
                s.kill()
    outputs = [(w / "run.out").read_text() for w in runs]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for name, info in archives.items():
        assert len(server.gets(f"{name}.zip")) == 1, name  # fetched by one run, used by both
        logs = [log_text(w, "extract", f"{info['folder']}.log") for w in runs]
        extracted = [log for log in logs if "Extracting " in log]
        reused = [log for log in logs if f"is already extracted from {name}.zip" in log]
        assert len(extracted) == 1 and len(reused) == 1, (name, logs)  # extracted by one run, used by the other
        assert not any("checking its MD5" in log for log in logs)  # the workflow's own download: trusted as checked
        folder = data / "coco2017" / info["folder"]
        extracted_bytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        assert extracted_bytes == info["extracted"], name  # whole, once
    waited = [log_text(w, "download", f"{first_archive}.log") for w in runs]
    assert any(f"{first_archive}.zip is already downloaded" in log for log in waited), waited
    leftovers = [p.name for p in (data / "coco2017").iterdir() if p.name.startswith((".extracting", ".replaced"))]
    assert leftovers == []


def test_an_archive_placed_by_hand_is_md5_checked_used_and_never_deleted(workdir, server, archives):
    name = "val2017"
    placed = workdir / "data" / "archives" / f"{name}.zip"
    placed.parent.mkdir(parents=True)
    shutil.copy(archives[name]["path"], placed)
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode == 0, result.stdout[-5000:]
    assert server.gets(f"{name}.zip") == []  # not downloaded: the one in data_dir was used
    assert placed.read_bytes() == archives[name]["path"].read_bytes()  # and not deleted, though archives are not kept
    downloaded = [n for n in archives if n != name]
    assert all(len(server.gets(f"{n}.zip")) == 1 for n in downloaded)
    assert not any((placed.parent / f"{n}.zip").exists() for n in downloaded)  # the workflow's own: deleted
    log = log_text(workdir, "extract", f"{archives[name]['folder']}.log")
    assert "was not downloaded by this workflow (or has changed since): checking its MD5" in log
    assert f"MD5 {archives[name]['md5']} as expected" in log


def test_a_wrong_archive_placed_by_hand_stops_the_run_and_is_kept(workdir, server, archives):
    name, other = "val2017", "train2017"
    placed = workdir / "data" / "archives" / f"{name}.zip"
    placed.parent.mkdir(parents=True)
    shutil.copy(archives[other]["path"], placed)
    result = run_snakemake(workdir, VERIFIED)
    assert result.returncode != 0
    assert f"has MD5 {archives[other]['md5']}, but archives.{name}.md5 in config.yaml says" in result.stdout
    assert "Replace it with the right file, or delete it so that the workflow downloads the archive" in result.stdout
    assert placed.read_bytes() == archives[other]["path"].read_bytes() and server.gets(f"{name}.zip") == []
    assert not (workdir / "data" / "coco2017" / archives[name]["folder"]).exists()


@pytest.fixture(scope="module")
def no_locks_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared library above, built with the machine's C compiler."""
    folder = tmp_path_factory.mktemp("no_locks")
    (folder / "no_locks.c").write_text(NO_LOCKS)
    library = folder / "no_locks.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(folder / "no_locks.c"), "-ldl"], check=True)
    return library


@pytest.mark.parametrize(
    ("folder", "setting", "target"),
    [("data", "data_dir", VERIFIED), ("results/train/state", "results_dir", "results/train/block_01/run.json")],
)
def test_a_file_system_that_cannot_lock_is_named_with_what_to_change(
    workdir, server, archives, no_locks_library, folder, setting, target
):
    """The data folder, then the training state's folder, on a file system whose locks fail with ENOLCK (NFS
    without its lock daemon): the step that locks stops with what to change, not a wait or "in use"."""
    where = workdir / folder
    where.mkdir(parents=True, exist_ok=True)
    env = {"LD_PRELOAD": str(no_locks_library), "NO_LOCKS_UNDER": str(where)}
    result = run_snakemake(workdir, target, env=env)
    assert result.returncode != 0
    output = " ".join(result.stdout.split())
    assert "cannot take file locks (No locks available)" in output, result.stdout[-4000:]
    assert f"or set {setting} in config.yaml to a folder on a file system that can lock" in output
    assert "Another training process" not in output
    if folder == "data":
        assert all(server.gets(f"{n}.zip") == [] for n in archives)  # stopped before fetching anything
    else:
        assert all(len(server.gets(f"{n}.zip")) == 1 for n in archives)  # the data steps went through
        assert not (workdir / "results" / "train" / "block_01" / "run.json").exists()

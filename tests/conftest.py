"""Shared fixtures: a tiny COCO dataset zipped as the three archives, served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.archive_server import ArchiveServer
from tests.helpers.tiny_coco import make_archives, make_dataset
from tests.helpers.workflow import tiny_config, write_config

# The xdist workers each run a workflow whose training takes every core: torch's OpenMP threads then busy-wait on
# cores the other workers' threads need. Passive waiting (inherited by snakemake, its jobs and SLURM's) about halves
# the time of two workflow tests run side by side (CHANGELOG); set OMP_WAIT_POLICY yourself to override it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The files that run the workflow, longest first: with the three pytest-xdist workers of pyproject.toml, each
# taking whole files in this order, the three longest start at once and the short files fill in behind them, rather
# than one of them starting last while the other workers have nothing left to do.
LONGEST_FILES = [
    "test_pipeline.py",
    "test_slurm.py",
    "test_faults.py",
    "test_training_faults.py",
    "test_shared_machine.py",
    "test_hook_gate.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: LONGEST_FILES.index(item.path.name) if item.path.name in LONGEST_FILES else 99)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("tiny_coco"))


@pytest.fixture(scope="session")
def archives(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return make_archives(tiny_dataset, tmp_path_factory.mktemp("archives"))


@pytest.fixture
def server(archives: dict[str, dict]) -> Iterator[ArchiveServer]:
    root = next(iter(archives.values()))["path"].parent
    with ArchiveServer(root) as running:
        yield running


@pytest.fixture
def workdir(tmp_path: Path, server: ArchiveServer, archives: dict[str, dict]) -> Path:
    """A fresh folder with a config.yaml that points the workflow at the local server."""
    write_config(tmp_path, tiny_config(tmp_path, server.url, archives))
    return tmp_path


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[callable]:
    """Mount real, small tmpfs file systems (a full disk or a small /dev/shm, without faking free space)."""
    mounts: list[Path] = []

    def mount(name: str, size: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        mounts.append(path)
        return path

    yield mount
    for path in reversed(mounts):
        subprocess.run(["umount", "-l", str(path)], check=False)


GPU_LEFT_OUT: set[str] = set()  # the node ids of the gpu tests deselected (by this process, or its xdist workers)


def pytest_deselected(items: list[pytest.Item]) -> None:
    GPU_LEFT_OUT.update(item.nodeid for item in items if item.get_closest_marker("gpu"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the list to the controller
        session.config.workeroutput["gpu_left_out"] = sorted(GPU_LEFT_OUT)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    GPU_LEFT_OUT.update(getattr(node, "workeroutput", {}).get("gpu_left_out", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say that the GPU tests were left out, and how to run them: README's command (pyproject's addopts deselect
    them)."""
    if GPU_LEFT_OUT and not hasattr(terminalreporter.config, "workeroutput"):
        terminalreporter.write_line(
            f"{len(GPU_LEFT_OUT)} GPU tests (marked gpu) were left out; on a machine with an NVIDIA GPU run them "
            'with: .venv/bin/pytest -m gpu -o addopts=""'
        )


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound, never listening, and held for the whole test, so no
    other test's server can take it in the meantime."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]

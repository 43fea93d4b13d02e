"""The test summary says how many GPU tests the default run left out, and the command it gives runs them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from tests.helpers.workflow import REPO

LINE = r"(\d+) GPU tests \(marked gpu\) were left out; on a machine with an NVIDIA GPU run them with: (.+)"


def pytest_in_repo(*args: str) -> subprocess.CompletedProcess[str]:
    """pytest run from the repository, with pyproject's addopts (not the ones this test run was given)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_summary_counts_the_gpu_tests_left_out_and_its_command_collects_them():
    default = pytest_in_repo("--collect-only", "-q", "-n", "0", "tests/test_gpu.py")
    assert default.returncode == 5, default.stdout  # pytest's "no tests collected": every test here is a gpu test
    said = [match for line in default.stdout.splitlines() if (match := re.fullmatch(LINE, line))]
    assert len(said) == 1, default.stdout
    left_out, command = int(said[0][1]), shlex.split(said[0][2])
    assert f"({left_out} deselected)" in default.stdout
    assert command[0] == ".venv/bin/pytest" and said[0][2] in (REPO / "README.md").read_text()  # README's command
    gpu = pytest_in_repo(*command[1:], "--collect-only", "-q", "tests/test_gpu.py")
    assert gpu.returncode == 0, gpu.stdout
    collected = [line for line in gpu.stdout.splitlines() if line.startswith("tests/test_gpu.py::")]
    assert len(collected) == left_out > 0 and f"{left_out} tests collected" in gpu.stdout
    assert not re.search(LINE, gpu.stdout, re.M)  # nothing left out when they are asked for

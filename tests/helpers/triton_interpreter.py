"""Test code run in Triton's interpreter, where the hooks' kernels run on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])


def in_the_interpreter(code: str) -> str:
    """Run `code` in a fresh Python with Triton's interpreter on (Triton reads `TRITON_INTERPRET` when a kernel is
    defined, so not in this process); fail with its error output if it fails; return what it printed."""
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels; without it the kernel never runs")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout

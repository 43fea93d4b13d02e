"""Triton kernels compiled for Hopper (sm_90a) on any machine, without a GPU: what Triton's interpreter cannot check."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def compile_for_hopper(kernel: Any, signature: dict, constants: dict, options: dict, attrs: dict | None = None) -> str:
    """The PTX Triton makes of `kernel` for sm_90 with `signature` (its arguments' types, "constexpr" for those in
    `constants`), the launch `options` (warps, stages) and `attrs` (what a launch tells Triton of its arguments)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs or {})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def assert_no_register_spills(ptx: str, folder: Path) -> None:
    """ptxas (Triton's own) assembles `ptx` for sm_90a, reports the registers it uses, and spills none to memory."""
    import triton

    source = folder / "kernel.ptx"
    source.write_text(ptx)
    ptxas = [triton.knobs.nvidia.ptxas.path, "-v", "-arch=sm_90a", str(source), "-o", str(folder / "kernel.cubin")]
    report = subprocess.run(ptxas, capture_output=True, text=True, check=True).stderr
    assert "Used " in report and "registers" in report, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report

"""Every command README.md shows works as written after the install it starts with: its program is in the virtual
environment the first block makes and activates, snakemake and pytest accept its options, the extras it installs
exist, and .ci/run runs exactly the README's test command."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers.workflow import REPO

README = (REPO / "README.md").read_text()
VENV_BIN = Path(sys.executable).parent  # the tests run in the environment the README's install makes
BLOCKS = re.findall(r"```bash\n(.*?)```", README, re.S)
PROSE = re.findall(r"`((?:snakemake|tensorboard|pytest|pip) [^`]*)`", README)


def commands() -> list[str]:
    """Each shell command of the README's bash blocks (split at &&), and each one it quotes in its prose."""
    found = [part.strip() for block in BLOCKS for line in block.splitlines() for part in line.split("&&")]
    return [command for command in found + PROSE if command]


def program_and_args(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    return Path(words[0]).name, words[1:]


def test_the_first_block_installs_and_activates_the_environment_the_later_commands_use():
    first = BLOCKS[0].splitlines()
    assert first[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e")
    assert first[1] == ". .venv/bin/activate"  # later commands, bare, find their programs in .venv/bin


@pytest.mark.parametrize("command", commands())
def test_each_command_is_one_the_installed_environment_runs(command):
    program, args = program_and_args(command)
    if program in ("python3", "."):
        return  # the venv's creation and activation
    assert (VENV_BIN / program).exists(), f"{program} is not in the virtual environment ({command})"
    if program == "snakemake":
        from snakemake.cli import get_argument_parser

        parsed = get_argument_parser().parse_args(args)
        for profile in [parsed.workflow_profile] if parsed.workflow_profile else []:
            assert (REPO / profile / "config.yaml").is_file(), command
    elif program == "pip":
        extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for extra in re.findall(r"\.\[([\w,]+)\]", command):
            assert set(extra.split(",")) <= set(extras), command
    elif program == "pytest":
        markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
        for marker in re.findall(r"-m (\w+)", command):
            assert any(m.startswith(f"{marker}:") for m in markers), command


def test_ci_runs_exactly_the_readmes_test_command():
    test_command = next(block.strip() for block in BLOCKS if ".venv/bin/pytest" in block)
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert test_command in ci, (test_command, ci)


def test_the_fp8_install_is_one_command_in_the_readme_its_fault_table_and_the_error_message():
    from pipeline.gpu_profiles import FP8_INSTALL, transformer_engine_problem

    problem = transformer_engine_problem()
    if problem is None:
        pytest.skip("Transformer Engine imports here: no error message to read")
    assert FP8_INSTALL in problem
    assert any(FP8_INSTALL in block.splitlines() for block in BLOCKS)  # the install block of "The FP8 route"
    row = next(line for line in README.splitlines() if line.startswith("| FP8 asked for without Transformer Engine"))
    assert f"`{FP8_INSTALL}`" in row
    fp8_installs = [line for line in README.splitlines() if ".[fp8]" in line]
    assert len(fp8_installs) == 2 and all(FP8_INSTALL in line for line in fp8_installs), fp8_installs

"""Every command README.md shows works as written after the install it starts with: its program is in the virtual
environment the first block makes and activates (a section whose install does not activate it names the program by
its path), snakemake and pytest accept its options, a `python -m` module exists and declares the options given and
all it requires, a script of the repository is executable bash, the extras it installs exist, and .ci/run runs
exactly the README's test command."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers.workflow import REPO

README = (REPO / "README.md").read_text()
VENV_BIN = Path(sys.executable).parent  # the tests run in the environment the README's install makes
BASH_BLOCK = r"```bash\n(.*?)```"
BLOCKS = re.findall(BASH_BLOCK, README, re.S)
# quoted in prose: a program of the environment with its arguments, or a script of this repository
PROSE = r"`((?:\.venv/bin/)?(?:snakemake|tensorboard|pytest|pip|python) [^`]*|[\w/.-]+\.sh)`"
SECTIONS = re.split(r"^## ", README, flags=re.M)


def commands(text: str = README) -> list[str]:
    """Each shell command of the bash blocks of `text` (split at &&), and each one it quotes in its prose."""
    blocks = re.findall(BASH_BLOCK, text, re.S)
    found = [part.strip() for block in blocks for line in block.splitlines() for part in line.split("&&")]
    return [command for command in found + re.findall(PROSE, text) if command]


def argparse_options(source: Path) -> tuple[set[str], set[str]]:
    """The --options a module's argparse parser declares, and those of them it requires."""
    declared, required = set(), set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args:
            names = {arg.value for arg in node.args if isinstance(arg, ast.Constant) and arg.value.startswith("--")}
            declared |= names
            if any(k.arg == "required" and getattr(k.value, "value", False) is True for k in node.keywords):
                required |= names
    return declared, required


def program_and_args(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    return Path(words[0]).name, words[1:]


def test_the_first_block_installs_and_activates_the_environment_the_later_commands_use():
    first = BLOCKS[0].splitlines()
    assert first[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e")
    assert first[1] == ". .venv/bin/activate"  # later commands, bare, find their programs in .venv/bin


def test_a_section_whose_install_does_not_activate_the_environment_runs_its_programs_by_path():
    """A reader may start at such a section (Test it): a bare `pytest` there would not be the environment's."""
    checked = 0
    for section in SECTIONS:
        blocks = "\n".join(re.findall(BASH_BLOCK, section, re.S))
        if "python3 -m venv .venv" not in blocks or ". .venv/bin/activate" in blocks:
            continue
        for command in commands(section):
            program = shlex.split(command)[0]
            if program != "python3" and (VENV_BIN / Path(program).name).exists():
                assert program.startswith(".venv/bin/"), f"{command!r} in '## {section.splitlines()[0]}'"
                checked += 1
    assert checked >= 3  # the Test it section's pytest commands


@pytest.mark.parametrize("command", commands())
def test_each_command_is_one_the_installed_environment_runs(command):
    program, args = program_and_args(command)
    if program in ("python3", "."):
        return  # the venv's creation and activation
    if program.endswith(".sh"):  # a script of this repository, run as written
        script = REPO / shlex.split(command)[0]
        assert script.is_file() and os.access(script, os.X_OK), f"{script} is not an executable file"
        assert (
            script.read_text().startswith("#!/usr/bin/env bash\n")
            and subprocess.run(["bash", "-n", script]).returncode == 0
        )
        return
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
    elif program == "python":
        assert args[0] == "-m", command
        module = importlib.util.find_spec(args[1])
        if module is not None and module.submodule_search_locations:  # a package runs its __main__
            module = importlib.util.find_spec(f"{args[1]}.__main__")
        assert module is not None and module.origin, f"no module {args[1]} to run ({command})"
        declared, required = argparse_options(Path(module.origin))
        given = {arg.split("=")[0] for arg in args[2:] if arg.startswith("--")}
        assert given <= declared and required <= given, (command, sorted(declared), sorted(required))
    elif program == "pytest":
        markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
        for marker in re.findall(r"-m (\w+)", command):
            assert any(m.startswith(f"{marker}:") for m in markers), command


def test_ci_runs_exactly_the_readmes_test_command():
    test_command = next(block.strip() for block in BLOCKS if ".venv/bin/pytest" in block)
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert test_command in ci, (test_command, ci)


def test_the_fp8_install_is_one_command_in_its_page_the_fault_table_and_the_error_message():
    from rfdetr_coco_pipeline.training.fp8 import INSTALL, transformer_engine_problem

    problem = transformer_engine_problem()
    if problem is None:
        pytest.skip("Transformer Engine imports here: no error message to read")
    assert INSTALL in problem
    fp8_page = (REPO / "docs" / "fp8.md").read_text()
    assert any(INSTALL in block.splitlines() for block in re.findall(BASH_BLOCK, fp8_page, re.S))
    faults = (REPO / "docs" / "faults.md").read_text()
    row = next(line for line in faults.splitlines() if line.startswith("| FP8 asked for without Transformer Engine"))
    assert f"`{INSTALL}`" in row
    for page in (README, fp8_page, faults):
        assert all(INSTALL in line for line in page.splitlines() if ".[fp8]" in line)


def test_the_prerequisites_are_the_configs_requests_and_the_benchmarks_projection():
    """ "Run it" states what a run takes: the training job's memory is `resources.train_mem_mb`, the RAM disk holds
    the extracted archives, and the time is what BENCHMARKS.md's projection command prints."""
    import json

    import yaml

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    needs = SECTIONS[[section.startswith("Run it") for section in SECTIONS].index(True)]
    assert f"{config['resources']['train_mem_mb'] / 1000:g} GB for the training job" in needs
    staged = sum(archive["extracted_bytes"] for archive in config["archives"].values()) / 1e9
    assert f"plus about {staged:.0f} GB of RAM disk" in needs
    benchmarks = (REPO / "BENCHMARKS.md").read_text()
    # the first projection command in BENCHMARKS.md is the workflow's, the notebook's comes after it
    projection = re.findall(r"^(python -m bench\.projection .*?)\n```", benchmarks, re.S | re.M)[0]
    words = shlex.split(projection.replace("\\\n", " "))
    printed = subprocess.run([sys.executable, *words[1:]], cwd=REPO, capture_output=True, text=True, check=True)
    result = json.loads(printed.stdout[printed.stdout.index("{") :])
    assert f"about {result['projected_hours']:.1f} hours for the 40 epochs" in needs
    assert f"{round(result['epoch_seconds'])} s per epoch with validation" in needs

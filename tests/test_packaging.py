"""The conda environment and pyproject.toml pin the same dependencies; code style and lint hold."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import yaml

from tests.helpers.workflow import REPO


def test_the_conda_environment_pins_the_same_versions_as_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs" / "pipeline.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(pip) == sorted(project)
    assert any(d.startswith("python=") for d in env["dependencies"] if isinstance(d, str))


def test_snakemake_lint_reports_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", "--cores", "1"], cwd=REPO, capture_output=True, text=True
    )
    output = result.stdout + result.stderr  # snakemake prints its verdict on stderr
    assert result.returncode == 0 and "Congratulations, your workflow is in a good condition!" in output, output


def test_the_workflow_is_snakefmt_formatted_and_the_python_ruff_clean():
    files = [str(REPO / "Snakefile"), *map(str, sorted((REPO / "rules").glob("*.smk")))]
    snakefmt = subprocess.run([sys.executable, "-m", "snakefmt", "--check", *files], capture_output=True, text=True)
    assert snakefmt.returncode == 0, snakefmt.stdout + snakefmt.stderr
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True)
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(REPO)], capture_output=True, text=True
    )
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr

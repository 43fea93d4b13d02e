"""Run the real workflow (the `snakemake` command) on a tiny dataset served over HTTP from 127.0.0.1."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from rfdetr_coco_pipeline.settings import Settings

REPO = Path(__file__).resolve().parents[2]
N_TRAIN, N_VAL = 8, 4
VERIFIED = "results/verify/dataset.json"  # the data steps' last output: download, extract, verify
BLOCK = "results/train/block_01/run.json"  # the first block's outputs (and everything before them)


def base_config() -> dict[str, Any]:
    with open(REPO / "config.yaml") as handle:
        return yaml.safe_load(handle)


def settings_of(config: dict[str, Any] | None = None, **train: Any) -> Settings:
    """The typed settings of `config` (the shipped one by default) with `train` keys changed."""
    config = copy.deepcopy(config or base_config())
    config["train"].update(train)
    return Settings.from_config(config)


def tiny_config(workdir: Path, server_url: str, archives: dict[str, dict], **train: Any) -> dict[str, Any]:
    """The shipped config.yaml, pointed at the local server and sized for a 2-core CPU."""
    config = base_config()
    config["archives"] = {
        name: {
            "url": f"{server_url}/{name}.zip",
            "md5": info["md5"],
            "folder": info["folder"],
            "size_bytes": info["size"],
            "extracted_bytes": info["extracted"],
        }
        for name, info in archives.items()
    }
    config["download"].update(
        attempts=3, backoff_seconds=0.2, max_backoff_seconds=1, timeout_seconds=10, disk_headroom_gb=0
    )
    config["verify"]["expected_images"] = {"train2017": N_TRAIN, "val2017": N_VAL}
    config["stage"].update(ramdisk=str(workdir / "shm"), headroom_gb=0)
    (workdir / "shm").mkdir(parents=True, exist_ok=True)
    config["train"].update(epochs=2, epochs_per_block=1, resolution=64, device="cpu", max_workers=0)
    config["train"].update(train)
    config["resources"].update(train_mem_mb=2000, evaluate_mem_mb=2000, evaluate_minutes=10, export_mem_mb=2000)
    return config


def write_config(workdir: Path, config: dict[str, Any]) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(config), sort_keys=False))
    return path


def snakemake_command(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]


def run_snakemake(
    workdir: Path, *args: str, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run snakemake to completion (with `env` added to this process's environment); the result carries its exit
    code and combined output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        snakemake_command(workdir, *args),
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def jobs_run(output: str) -> list[str]:
    """Rules of the jobs snakemake finished, in order (its 'Finished jobid: N (Rule: X)' lines), 'all' left out."""
    return [name for name in re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", output) if name != "all"]


def dry_run_jobs(output: str) -> dict[str, int]:
    """The jobs of a dry run by rule, from its 'Job stats' table ('all' and the total left out)."""
    table = output[output.index("Job stats:") :].split("\n\n")[0]
    return {
        rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule not in ("all", "total")
    }


def start_snakemake(workdir: Path, *args: str, name: str = "background") -> subprocess.Popen[str]:
    """Start snakemake in its own process group (so a test can kill it and its jobs, like a lost node);
    its output goes to <workdir>/<name>.out."""
    output = open(workdir / f"{name}.out", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        snakemake_command(workdir, *args),
        cwd=workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_job(snakemake: subprocess.Popen[str], marker: str, timeout: float = 600) -> psutil.Process:
    """The first Python process under `snakemake` whose command line contains `marker`, as soon as it runs
    (not the job's shell, whose command line names every script of the job)."""
    deadline = time.time() + timeout
    while time.time() < deadline and snakemake.poll() is None:
        for process in psutil.Process(snakemake.pid).children(recursive=True):
            try:
                if process.name().startswith("python") and marker in " ".join(process.cmdline()):
                    return process
            except psutil.Error:
                continue
        time.sleep(0.02)
    raise AssertionError(f"no job matching {marker!r} started (snakemake exit code {snakemake.poll()})")


def wait_for_file(
    snakemake: subprocess.Popen[str], pattern: str, root: Path, timeout: float = 600, every: float = 0.1
) -> Path:
    """The first path under `root` matching `pattern`, as soon as one appears (looked for `every` seconds)."""
    deadline = time.time() + timeout
    while time.time() < deadline and snakemake.poll() is None:
        found = next(root.glob(pattern), None)
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{pattern} never appeared under {root} (snakemake exit code {snakemake.poll()})")


def kill_group(snakemake: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    """Kill snakemake and every job it started, at once: what a lost node or `kill -9` does."""
    os.killpg(snakemake.pid, sig)
    snakemake.wait(timeout=60)


def rerun_after_a_kill(workdir: Path, *targets: str) -> str:
    """What the README says to do after a killed snakemake: unlock, then the same command again."""
    locked = run_snakemake(workdir, *targets)
    assert locked.returncode != 0 and "--unlock" in locked.stdout  # the stale lock is named, with its fix
    assert run_snakemake(workdir, "--unlock").returncode == 0
    result = run_snakemake(workdir, *targets)
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout


def times_fetched(server: Any, archive: str) -> int:
    """How many GET requests the test's ArchiveServer answered for `archive`.zip."""
    return len(server.gets(f"{archive}.zip"))

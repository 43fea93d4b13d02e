"""The SLURM profile against a real SLURM of two nodes on this machine (Debian's SLURM packages and munge, a fake
`gpu` GRES), started by tests/slurm/start.sh: the jobs go through sbatch with the expected requests, staging and
training share a job, a training job cancelled mid-block is resubmitted and resumes, and training tasks started by
srun span one node or two."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers.workflow import REPO, run_snakemake, snakemake_command, tiny_config, wait_for_file, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PARTITION = "debug"  # the test cluster's default partition: its first node alone


def slurm_ready() -> bool:
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, check=False)
    return bool(re.search(r"^(idle|mixed|allocated)", states.stdout, re.M))


STATE = Path(os.environ.get("SLURM_TEST_STATE", "/tmp/slurm-test"))  # tests/slurm/start.sh's state folder


DAEMONS = ("munged", "slurmctld", "slurmd")  # what start.sh starts


@pytest.fixture(scope="module")
def slurm() -> Iterator[None]:
    """A two-node SLURM for this module (tests/slurm/start.sh). However it ends (started, or not started after some
    of its daemons did), the daemons it started are stopped and /etc is put back."""
    try:
        started = subprocess.run(["bash", str(REPO / "tests" / "slurm" / "start.sh")], capture_output=True, text=True)
        if not slurm_ready():
            reason = f"SLURM cannot run here: {started.stdout.strip()} {started.stderr.strip()}"
            print(reason)
            pytest.skip(reason)
        yield
    finally:
        stop_started_daemons()
        restore_etc()


def stop_started_daemons() -> None:
    """Stop the daemons whose PIDs start.sh wrote, each only while that PID is still one of its daemons."""
    pids = STATE / "started.pids"
    for pid in map(int, pids.read_text().split() if pids.exists() else []):
        with contextlib.suppress(psutil.Error):
            daemon = psutil.Process(pid)
            if daemon.name() in DAEMONS:
                daemon.terminate()
                daemon.wait(timeout=30)
    pids.unlink(missing_ok=True)


def restore_etc() -> None:
    """/etc as it was: the files start.sh created go, the ones it overwrote come back."""
    created = STATE / "created.files"
    for path in created.read_text().split() if created.exists() else []:
        Path(path).unlink(missing_ok=True)
    created.unlink(missing_ok=True)
    for saved in (STATE / "backup").glob("*"):
        shutil.copy2(saved, Path("/etc/slurm") / saved.name)
        saved.unlink()


def slurm_test_profile(tmp_path: Path) -> Path:
    """profiles/slurm with only the partition and the limits changed for a 2-core test node. The test cluster
    keeps no accounting database, so job states come from squeue and no account is asked for."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["slurm_partition"] = PARTITION
    profile["set-resources"]["train_block"]["slurm_partition"] = PARTITION
    profile["set-resources"]["evaluate"]["slurm_partition"] = PARTITION
    profile["set-resources"]["check_gpus"]["slurm_partition"] = PARTITION
    profile["set-threads"] = {rule: min(2, threads) for rule, threads in profile["set-threads"].items()}
    profile["set-threads"]["train_block"] = 2  # the rule asks for 16 cores on a CPU run
    profile["latency-wait"] = 10
    profile.update(
        {
            "slurm-status-command": "squeue",
            "slurm-no-account": True,
            "slurm-init-seconds-before-status-checks": 2,
            "slurm-keep-successful-logs": True,
        }
    )
    folder = tmp_path / "slurm-profile"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


def slurm_jobs() -> dict[str, dict[str, str]]:
    """Every job SLURM still knows (MinJobAge keeps finished ones for an hour), by job id."""
    shown = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True, check=False).stdout
    jobs = {}
    for line in shown.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            jobs[fields["JobId"]] = fields
    return jobs


def run_with_profile(workdir: Path, profile: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    command = [c for c in snakemake_command(workdir) if c not in ("--cores", "2")]
    return subprocess.run(
        [*command, "--workflow-profile", str(profile)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def test_with_no_local_rules_the_downloads_go_through_sbatch_too(slurm, workdir, server, archives, tmp_path):
    config = tiny_config(workdir, server.url, archives)
    config["cluster"]["local_rules"] = []  # a cluster whose compute nodes reach the internet
    write_config(workdir, config)
    before = set(slurm_jobs())
    command = [c for c in snakemake_command(workdir) if c not in ("--cores", "2")]
    profile = ["--workflow-profile", str(slurm_test_profile(tmp_path))]
    result = subprocess.run(
        [*command, *profile, "data/coco2017/annotations"], cwd=workdir, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-5000:]
    rules = sorted(
        re.match(r"rule_([a-z_]+?)(_wildcards|$)", j["Comment"]).group(1)
        for i, j in slurm_jobs().items()
        if i not in before
    )
    assert rules == ["download_archive", "extract_archive"]


def test_the_gpu_check_runs_through_sbatch_where_training_will_and_stops_the_run_before_any_download(
    slurm, workdir, server, archives, tmp_path
):
    """The login node has no GPU, and it is not asked for one: the check is a SLURM job on the training's partition
    with train.gpus GPUs. This node's GPUs are SLURM's fake GRES, which torch does not see, so the check stops the
    run there, before anything is fetched, with the training job's own message."""
    write_config(workdir, tiny_config(workdir, server.url, archives, device="cuda", epochs=1, gpus=2))
    before = set(slurm_jobs())
    result = run_with_profile(workdir, slurm_test_profile(tmp_path), timeout=300)
    assert result.returncode != 0 and server.requests == [] and not (workdir / "data" / "archives").exists()
    jobs = [job for job_id, job in slurm_jobs().items() if job_id not in before]
    (check,) = jobs  # one submission: the profile's retries do not apply to the check
    assert "rule_check_gpus" in check["Comment"]
    assert check["JobState"] == "FAILED" and check["Partition"] == PARTITION
    assert re.search(r"gres[/:]gpu:2", check["TresPerJob"])
    log = (workdir / "results" / "logs" / "preflight" / "gpus.log").read_text()
    assert "No CUDA GPU is visible" in log and "--config preflight=false" in log


def processes_of_job(job_id: str) -> list[psutil.Process]:
    """The processes on this node that belong to SLURM job `job_id` (by the SLURM_JOB_ID they were started with)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("SLURM_JOB_ID") == job_id:
                found.append(process)
    return found


def training_ranks_of_job(job_id: str) -> list[psutil.Process]:
    """The workflow's training processes (rank 0 and the ranks Lightning starts) in SLURM job `job_id`; one that
    ends while it is being looked at is not counted (the job's shell can exit between the listing and the look)."""
    ranks = []
    for process in processes_of_job(job_id):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.name().startswith("python") and any(a.endswith("scripts/train.py") for a in process.cmdline()):
                ranks.append(process)
    return ranks


def test_the_workflow_runs_through_sbatch_and_a_training_job_cancelled_mid_block_is_resumed(
    slurm, workdir, server, archives, tmp_path
):
    # two DDP ranks (gloo on the CPU) in a job that asks SLURM for 2 (fake) GPUs: Lightning starts rank 1 as a child
    # process of rank 0
    write_config(workdir, tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=2, gpus=2))
    # The first two archives on this machine: every submitted rule still goes through sbatch once (train2017's
    # extraction, then verify, train, plot, evaluate and export), and the other data jobs, each a SLURM round trip
    # of about 14 s here (the plugin's status checks back off while a job runs), are left out.
    assert run_snakemake(workdir, "data/coco2017/val2017").returncode == 0
    before = set(slurm_jobs())
    command = [c for c in snakemake_command(workdir) if c not in ("--cores", "2")]
    profile = ["--workflow-profile", str(slurm_test_profile(tmp_path))]
    with open(workdir / "snakemake.out", "w") as output:
        snakemake = subprocess.Popen(
            [*command, *profile], cwd=workdir, stdout=output, stderr=subprocess.STDOUT, text=True
        )
        wait_for_file(snakemake, "*/last.ckpt", workdir / "results" / "train" / "state")  # epoch 1 is saved
        running = [
            i
            for i, j in slurm_jobs().items()
            if i not in before and "train_block" in j["Comment"] and j["JobState"] == "RUNNING"
        ]
        assert len(running) == 1
        assert len(training_ranks_of_job(running[0])) == 2  # rank 0 and the rank it started
        subprocess.run(["scancel", running[0]], check=True)
        try:
            # every training rank of the cancelled job ends with it (checked while snakemake resubmits the block).
            # The snakemake that the SLURM plugin runs inside the job is SLURM's to end: when its own shutdown
            # outlasts the job's shell, proctrack/linuxproc here loses it once it is reparented (a cluster's
            # proctrack/cgroup does not), so it is ended below rather than asserted on.
            deadline = time.time() + 120
            while training_ranks_of_job(running[0]) and time.time() < deadline:
                time.sleep(0.5)
            left = [" ".join(p.cmdline())[:120] for p in training_ranks_of_job(running[0])]
            assert left == [], left
            assert snakemake.wait(timeout=900) == 0, (workdir / "snakemake.out").read_text()[-5000:]
        finally:
            for process in processes_of_job(running[0]):
                with contextlib.suppress(psutil.Error):
                    process.kill()
    assert (workdir / "results" / "plots" / "summary.txt").is_file()
    assert (workdir / "results" / "eval" / "metrics.json").is_file()
    assert (workdir / "results" / "export" / "model.onnx").is_file()

    by_rule: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for job_id, job in sorted(slurm_jobs().items(), key=lambda item: int(item[0])):
        if job_id not in before:
            rule = re.match(r"rule_([a-z_]+?)(_wildcards|$)", job["Comment"]).group(1)
            by_rule.setdefault(rule, []).append((job_id, job))
    # cluster.local_rules' default: the download ran here, on the machine where snakemake runs, not through sbatch
    assert len(server.gets("train2017.zip")) == 1 and (workdir / "data" / "coco2017" / "train2017").is_dir()
    assert sorted((r, len(j)) for r, j in by_rule.items()) == [
        ("evaluate", 1),
        ("export_model", 1),
        ("extract_archive", 1),
        ("plot_metrics", 1),
        ("train_block", 2),  # the cancelled job and the one snakemake submitted again
        ("verify_counts", 1),
    ]
    assert "train2017" in by_rule["extract_archive"][0][1]["Comment"]
    assert [job["JobState"] for _, job in by_rule["train_block"]] == ["CANCELLED", "COMPLETED"]
    train_id, train = by_rule["train_block"][-1]
    assert train["Partition"] == PARTITION
    assert re.search(r"gres[/:]gpu:2", train["TresPerJob"])  # train.gpus: 2
    assert train["NumCPUs"] == "2"  # the test profile's threads for this 2-core node
    assert train["MinMemoryNode"] == "2000M"  # resources.train_mem_mb (the tiny set adds no RAM-disk MB)
    assert train["TimeLimit"] == "01:00:00"  # 30 min + 15 min per epoch of the block
    # the other jobs: the profile's threads (capped at 2) and runtimes, the memory of resources.*, no GPU
    for rule, cpus, limit, memory in [
        ("extract_archive", "2", "02:00:00", "4000M"),
        ("verify_counts", "2", "02:00:00", "8000M"),
        ("plot_metrics", "1", "02:00:00", "4000M"),
        ("evaluate", "2", "00:10:00", "2000M"),  # resources.evaluate_minutes and _mem_mb (tiny_config's)
        ("export_model", "1", "02:00:00", "2000M"),
    ]:
        ((_, job),) = by_rule[rule]
        requested = (job["JobState"], job["Partition"], job["NumCPUs"], job["TimeLimit"], job["MinMemoryNode"])
        assert requested == ("COMPLETED", PARTITION, cpus, limit, memory), rule
        assert "gpu" not in job.get("TresPerJob", ""), rule

    # the resubmitted job resumed the block; staging and training ran in that same SLURM job, on the same node
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "resuming the interrupted block" in log and "at epoch 2" in log
    stage = json.loads((workdir / "results" / "train" / "block_01" / "stage.json").read_text())
    run = json.loads((workdir / "results" / "train" / "block_01" / "run.json").read_text())
    assert stage["slurm_job_id"] == run["slurm_job_id"] == train_id and run["resumed_from"].endswith("last.ckpt")
    assert stage["host"] == run["host"] == train["NodeList"]
    # both DDP ranks ran inside the one job, started by Lightning, sharing its 2 CPUs (a thread per CPU each would
    # overcommit them, several times slower on the CPU)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert "Host threads of the training process: 1" in log and "training process: 2" not in log
    assert run["recipe"]["gpus"] == 2 and run["recipe"]["lr"] == pytest.approx(2e-4)  # lr_scaling: linear


def test_training_tasks_on_two_nodes_warned_mid_epoch_stop_and_the_resubmitted_job_resumes(
    slurm, workdir, server, archives, tmp_path
):
    """`train.nodes: 2` (srun's launch, `train.launch: auto`), on two nodes of this machine, each its own slurmd: the
    job asks SLURM for a task on each node, srun stages once per node and starts the ranks (Lightning's SLURM
    environment takes them from SLURM_PROCID). Warned mid-epoch by the SIGTERM SLURM sends before a time limit or a
    preemption (the profile's --signal; here `scancel --signal=TERM`), every task stops at its next step, the job
    fails, and the job Snakemake submits again resumes, each epoch once in the metrics. (A one-node run through srun,
    `train.launch: srun`, takes the same path with --nodes=1.)"""
    nodes = 2
    config = tiny_config(workdir, server.url, archives, epochs=2, epochs_per_block=2, gpus=1, nodes=nodes)
    write_config(workdir, config)
    assert run_snakemake(workdir, "results/verify/dataset.json").returncode == 0  # the data, on this machine
    before = set(slurm_jobs())
    profile_folder = slurm_test_profile(tmp_path)
    profile_file = profile_folder / "config.yaml"
    profile = yaml.safe_load(profile_file.read_text())
    profile["set-resources"]["train_block"]["slurm_partition"] = "two"  # both nodes
    profile_file.write_text(yaml.safe_dump(profile))
    command = [c for c in snakemake_command(workdir) if c not in ("--cores", "2")]
    block = "results/train/block_01/run.json"
    state = workdir / "results" / "train" / "state"
    with open(workdir / "snakemake.out", "w") as output:
        snakemake = subprocess.Popen(
            [*command, "--workflow-profile", str(profile_folder), block],
            cwd=workdir,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for_file(snakemake, "*/last.ckpt", state)  # epoch 1 is saved: the stop lands in epoch 2
        (job_id,) = [i for i, j in slurm_jobs().items() if i not in before and "train_block" in j["Comment"]]
        ranks = training_ranks_of_job(job_id)
        assert len(ranks) == 2  # both started by srun: neither is the other's parent
        assert {r.ppid() for r in ranks}.isdisjoint({r.pid for r in ranks})
        subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
        try:
            deadline = time.time() + 120
            while training_ranks_of_job(job_id) and time.time() < deadline:
                time.sleep(0.5)
            assert training_ranks_of_job(job_id) == []  # every task stopped, on both nodes
            assert snakemake.wait(timeout=900) == 0, (workdir / "snakemake.out").read_text()[-5000:]
        finally:
            for process in processes_of_job(job_id):
                with contextlib.suppress(psutil.Error):
                    process.kill()
    jobs = {i: j for i, j in slurm_jobs().items() if i not in before and "train_block" in j["Comment"]}
    stopped_id, resubmitted_id = sorted(jobs, key=int)
    assert (jobs[stopped_id]["JobState"], jobs[resubmitted_id]["JobState"]) == ("FAILED", "COMPLETED")
    slurm_log = workdir / ".snakemake" / "slurm_logs" / "rule_train_block" / "block_01" / f"{stopped_id}.log"
    assert "Training was stopped by SIGTERM. The last completed epoch is saved" in slurm_log.read_text()
    resubmitted = jobs[resubmitted_id]
    assert (resubmitted["NumNodes"], resubmitted["NumTasks"]) == (str(nodes), "2")
    log = (workdir / "results" / "logs" / "train" / "block_01.log").read_text()
    assert "resuming the interrupted block" in log
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    run = json.loads((workdir / "results" / "train" / "block_01" / "run.json").read_text())
    assert run["recipe"].get("nodes", 1) == nodes and run["recipe"]["lr"] == pytest.approx(2e-4)  # 2 GPUs in all
    # one metrics history: each epoch once, in order
    rows = list(csv.DictReader(open(workdir / "results" / "train" / "block_01" / "metrics.csv")))
    epochs = [int(row["epoch"]) for row in rows if row.get("val/loss") or row.get("val/mAP_50_95")]
    assert sorted(set(epochs)) == [0, 1] and len(epochs) == len(set(epochs)), epochs
    # staging ran once on every node of the job that trained, each node writing its own report
    stage_log = (workdir / "results" / "logs" / "train" / "block_01.stage.log").read_text()
    assert len(re.findall(r"Staging \d+ files|Reusing the staged copy", stage_log)) == nodes, stage_log
    folder = workdir / "results" / "train" / "block_01"
    reports = [folder / "stage.json", *(folder / f"stage.node{n}.json" for n in range(1, nodes))]
    staged_on = [json.loads(report.read_text()) for report in reports]
    assert {s["slurm_job_id"] for s in staged_on} == {resubmitted_id}
    assert len({s["slurm_node"] for s in staged_on}) == nodes
    assert not (folder / f"stage.node{nodes}.json").exists()

"""The processes of a training job: which one is the main rank, that SLURM started the ones the recipe trains on, and
how every one of them dies with the job.

With Lightning's launch the job's shell starts rank 0, and Lightning starts the other ranks of a one-node DDP run
(`train.gpus` > 1) as child processes of rank 0. With srun's launch SLURM starts every rank as a task of one job
step, on every node, and ends them all with the step.

When a scheduler cancels the job (scancel, a time limit), its SIGTERM ends the shell at once, and a rank that
outlives its parent is reparented: a scheduler that tracks processes by parentage (SLURM's
proctrack/linuxproc) no longer sees it, and ranks that stop at different steps wait for each other in a collective
for ever. `die_with_parent` asks the kernel to kill a rank when its parent ends (PR_SET_PDEATHSIG): rank 0 when the
job's shell does, the others when rank 0 does. The last finished epoch is saved every epoch, so nothing is lost that
a graceful stop would keep.
"""

from __future__ import annotations

import ctypes
import os
import signal

from rfdetr_coco_pipeline.common import StageError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def is_main_rank() -> bool:
    return all(os.environ.get(var, "0") == "0" for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def die_with_parent() -> bool:
    """Have the kernel SIGKILL this process when its parent ends; True when set."""
    parent = os.getppid()
    if parent == 1:  # started by init: no parent to die with
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def check_srun_tasks(gpus: int, nodes: int) -> None:
    """Under srun's launch, before anything is built: StageError unless this process is a task of a SLURM job step
    with `gpus` tasks on each of `nodes` nodes. The layout check is Lightning's own (`SLURMEnvironment`), run here
    so that it stops the job before the model is built and names the workflow's settings, not Lightning's."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    if "SLURM_STEP_ID" not in os.environ or "SLURM_PROCID" not in os.environ:
        raise StageError(
            f"train.launch starts the training ranks with srun (train.nodes: {nodes}, train.gpus: {gpus}), but this "
            "process was not started by srun. Run the workflow with the SLURM profile (snakemake --workflow-profile "
            "profiles/slurm), or set train.nodes: 1 and train.launch: lightning."
        )
    try:
        SLURMEnvironment(auto_requeue=False).validate_settings(num_devices=gpus, num_nodes=nodes)
    except (ValueError, RuntimeError) as error:  # RuntimeError: srun given --ntasks without --ntasks-per-node
        raise StageError(
            f"SLURM did not start the task layout the recipe trains on, {gpus} task(s) on each of {nodes} node(s) "
            f"(train.gpus: {gpus}, train.nodes: {nodes}). Lightning says: {error} Leave the task layout to the "
            "train_block rule's resources (--nodes, --ntasks-per-node), not to the SLURM profile's train_block."
        ) from error

"""The processes of a training job: which one is the main rank, and how every one of them dies with the job.

The job's shell starts rank 0; Lightning starts the other ranks of a one-node DDP run (`train.gpus` > 1) as child
processes of rank 0. When a scheduler cancels the job (scancel, a time limit), its SIGTERM ends the shell at once,
and a rank that outlives its parent is reparented: a scheduler that tracks processes by parentage (SLURM's
proctrack/linuxproc) no longer sees it, and ranks that stop at different steps wait for each other in a collective
for ever. `die_with_parent` asks the kernel to kill a rank when its parent ends (PR_SET_PDEATHSIG): rank 0 when the
job's shell does, the others when rank 0 does. The last finished epoch is saved every epoch, so nothing is lost that
a graceful stop would keep.
"""

from __future__ import annotations

import ctypes
import os
import signal

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

"""The processes of a training job: which one is the main rank, and how the others die with it.

Lightning starts the ranks of a one-node DDP run (`train.gpus` > 1) as child processes of rank 0. When rank 0 is
killed outright (scancel after its grace period, a lost node's job, `kill -9`), its children would be reparented and
live on outside the job, where a scheduler that tracks processes by parentage (SLURM's proctrack/linuxproc) no longer
sees them. `die_with_parent` asks the kernel to kill such a rank when its parent ends (PR_SET_PDEATHSIG). Shown by
`tests/test_slurm.py::test_a_training_job_cancelled_mid_block_leaves_no_process_and_is_resumed`.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def is_main_rank() -> bool:
    return all(os.environ.get(var, "0") == "0" for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def die_with_parent() -> bool:
    """In a rank other than 0, have the kernel SIGKILL this process when its parent ends; True when set."""
    if os.environ.get("LOCAL_RANK", "0") == "0" or not hasattr(os, "getppid"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if parent == 1 or os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True

"""On SIGTERM, every rank of a multi-rank run stops at the start of the same training step.

A scheduler's warning (SLURM's --signal before a time limit or a preemption, a user's `scancel --signal=TERM`) must
stop every rank, or the ranks still running wait for the stopped ones until the job is killed. Lightning 2.6.6 can
leave them so in two ways (Lightning issue #20806): its handler broadcasts from inside the handler, a collective at
whatever point the main thread was when the signal came, which another rank may meet only with a different one
(the gradient all-reduce), so that both wait; and a rank raises on its own flag at the end of a step, while a rank
signalled a moment later goes on into the next step and waits for it.

Here the handler only records the signal (and forwards it to the ranks Lightning started, as before). At the start
of each training step, where Lightning already exchanges its flag, the ranks take the maximum of their records:
when any rank has one, all set Lightning's `received_sigterm`, meet at a barrier and raise Lightning's
`SIGTERMException` together. A run of one rank, or before the ranks are connected, is Lightning's own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rfdetr_coco_pipeline.hooks.patching import patch_rfdetr_all

log = logging.getLogger(__name__)

SIGNAL_CONNECTOR = "pytorch_lightning.trainer.connectors.signal_connector:_SignalConnector"
EPOCH_LOOP = "pytorch_lightning.loops.training_epoch_loop:_TrainingEpochLoop"

RECORDED = "_sigterm_recorded"  # on Lightning's signal connector: this rank got a SIGTERM not yet acted on


def _connected(trainer: Any) -> bool:
    import torch.distributed as dist

    return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()


def record_only(original: Callable[..., Any]) -> Callable[..., Any]:
    def _sigterm_notifier_fn(self: Any, signum: int, frame: Any) -> None:
        if not _connected(self.trainer):
            return original(self, signum, frame)
        log.info("Rank %d received SIGTERM: every rank stops at the start of the next step", self.trainer.global_rank)
        if not getattr(self, RECORDED, False):
            launcher = self.trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        setattr(self, RECORDED, True)

    return _sigterm_notifier_fn


def stop_together(_original: Callable[..., Any]) -> Callable[..., Any]:
    def _broadcast_sigterm_tensor(self: Any) -> None:
        import torch
        import torch.distributed as dist
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        trainer = self.trainer
        connector = trainer._signal_connector
        recorded = getattr(connector, RECORDED, False) or connector.received_sigterm
        flag = torch.tensor([int(recorded)], device=trainer.strategy.root_device)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        except Exception:  # as Lightning: when the exchange itself fails, each rank goes by its own record
            log.warning("The ranks could not exchange whether one received SIGTERM; this rank goes by its own")
        if flag.item() == 1:
            connector.received_sigterm = True
            with contextlib.suppress(Exception):
                dist.barrier()
            raise SIGTERMException()

    return _broadcast_sigterm_tensor


def sigterm_at_one_step() -> AbstractContextManager[None]:
    """Within this block, a SIGTERM to any rank of a connected multi-rank Trainer stops every rank at the start of
    the same training step with Lightning's `SIGTERMException`; a one-rank Trainer handles it as Lightning does."""
    return patch_rfdetr_all(
        (SIGNAL_CONNECTOR, "_sigterm_notifier_fn", record_only),
        (EPOCH_LOOP, "_broadcast_sigterm_tensor", stop_together),
    )

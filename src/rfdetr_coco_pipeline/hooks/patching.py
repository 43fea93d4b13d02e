"""How a hook replaces a part of rfdetr (or Lightning): inside a `with` block only, and put back afterwards.

Whether a hook may be used at all is the registry's gate (`rfdetr_coco_pipeline.hooks`): nothing here checks a
version or a source, so the one gate is in one place.
"""

from __future__ import annotations

import os
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


@contextmanager
def patch_rfdetr(owner: str, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """Within this block `owner.name` is `wrap(original)`; afterwards it is the original again, also after an error.

    `owner` is a module or a "module:Class" path (`pkgutil.resolve_name`), looked up when the block starts.
    """
    target = pkgutil.resolve_name(owner)
    original = getattr(target, name)
    setattr(target, name, wrap(original))
    try:
        yield
    finally:
        setattr(target, name, original)


@contextmanager
def patch_rfdetr_all(*patches: tuple[str, str, Callable[[Any], Any]]) -> Iterator[None]:
    """Within this block every `(owner, name, wrap)` of `patches` is in place, entered in order with `patch_rfdetr`;
    afterwards all are the originals again."""
    with ExitStack() as stack:
        for owner, name, wrap in patches:
            stack.enter_context(patch_rfdetr(owner, name, wrap))
        yield


def send_without_waiting(host: Any, device: Any) -> Any:
    """`host` (a CPU tensor) on `device`. To a GPU it goes from pinned memory without blocking, so the host does not
    wait for the work already queued there; the tensor must not be changed afterwards."""
    if str(device).startswith("cuda"):
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def triton_kernels_run_on(tensor: Any) -> bool:
    """Whether a hook's Triton kernels can run on `tensor`: on CUDA, or on the CPU under Triton's interpreter
    (`TRITON_INTERPRET=1`: how the tests run them without a GPU)."""
    return tensor.is_cuda or (tensor.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")

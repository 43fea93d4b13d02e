"""How an extension replaces a part of rfdetr: inside a `with` block only, and put back afterwards.

Which rfdetr version the extensions were checked against, and whether the installed one is it, is the registry's
business (`rfdetr_extensions.select_speedups`): nothing here refuses a version, so the one gate is in one place.
"""

from __future__ import annotations

import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


def installed_rfdetr() -> str:
    """The version of the rfdetr package this interpreter imports: what `select_speedups` compares with
    `CHECKED_RFDETR`. Shown by
    `tests/test_rfdetr_extensions.py::test_the_install_pins_the_checked_rfdetr_and_it_is_the_one_this_python_imports`.
    """
    return importlib.metadata.version("rfdetr")


@contextmanager
def patch_rfdetr(owner: str, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """Within this block `owner.name` is `wrap(original)`; afterwards it is the original again, also after an error.

    `owner` is a module or a "module:Class" path (`pkgutil.resolve_name`), looked up when the block starts.
    Shown by `tests/test_rfdetr_extensions.py::test_rfdetrs_code_is_replaced_inside_the_block_and_restored_after`.
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
    afterwards all are the originals again. Shown by the same test as `patch_rfdetr`."""
    with ExitStack() as stack:
        for owner, name, wrap in patches:
            stack.enter_context(patch_rfdetr(owner, name, wrap))
        yield


def send_without_waiting(host: Any, device: Any) -> Any:
    """`host` (a CPU tensor) on `device`. To a GPU it goes from pinned memory without blocking, so the host does not
    wait for the work already queued there; the tensor must not be changed afterwards. Shown on a GPU (torch's sync
    debug mode set to error) by
    `tests/test_padding_in_one_copy.py::test_on_the_gpu_the_padding_equals_pad_sequences_and_nothing_waits` and
    `tests/test_images_as_bytes.py::test_on_the_gpu_the_floats_equal_rfdetrs_and_nothing_waits`."""
    if str(device).startswith("cuda"):
        host = host.pin_memory()
    return host.to(device, non_blocking=True)

"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``.

On a GPU, a training step that reads a device value on the host (``item``,
``tolist``, ``bool(t)``, ``int(t)``), makes a tensor whose size depends on
device data (``nonzero``, boolean-mask indexing, ``unique``, ``bincount``,
``repeat_interleave`` without ``output_size``, ``masked_select``) or copies a
host list to the device (``torch.tensor(list, device=...)``) stalls the host
until the device catches up. On the CPU nothing stalls, so the same calls are
caught here by name: ``forbid_host_syncs()`` patches them to raise
``HostSync`` when they are called from a file under ``scope`` (the
``dynamicemb`` package by default), so TorchRec's own code, which both a
dynamic and a static table run, is not counted.

It is a proxy: a synchronization made inside a C++ op (a tensor passed where
an int is expected) is not seen here; the GPU tests with
``set_sync_debug_mode("error")`` see those.
"""

import contextlib
import os
import sys
import traceback

import torch

import dynamicemb

PACKAGE_DIR = os.path.dirname(os.path.abspath(dynamicemb.__file__))

# The reads a CPU step makes by design (dynamicemb/storage/padded.py): the CPU
# table kernels refuse the padding's reserved key, so the storage hands them
# the distinct (or, with admission, the looked-up) entries only, cut out on the
# host; on a GPU the padding goes to the kernels, which skip it.
CPU_ONLY_READS = frozenset({"storage/padded.py:train_prefix", "storage/padded.py:train_selected"})

# Reads of host memory a step makes by design (dynamicemb/embedding/insert_failures.py):
# the host copy of the insert failure counters is read only once the device has
# written it (an event the step queries without waiting; on the CPU the copy is
# made at once, the device being the host).
HOST_COPY_READS = frozenset({"embedding/insert_failures.py:_read_copy"})

# Everything a training step may read on the host.
STEP_READS = CPU_ONLY_READS | HOST_COPY_READS


class HostSync(AssertionError):
    """A call that would synchronize the host with a CUDA device."""


def _caller(depth: int) -> tuple[str, str]:
    frame = sys._getframe(depth + 1)
    return os.path.abspath(frame.f_code.co_filename), frame.f_code.co_name


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def forbid_host_syncs(
    scope: str = PACKAGE_DIR, record: list | None = None, allow: set[str] | frozenset = frozenset()
):
    """Within the block, a synchronizing call made from ``scope`` raises
    ``HostSync`` naming it (or, with ``record``, is appended to it as
    ``(name, stack)`` and goes on). ``allow``: calls made directly in these
    functions pass, each named ``"path/under/scope.py:function"``."""
    T = torch.Tensor
    saved: list[tuple[object, str, object]] = []

    def _caller_in() -> bool:
        # The frame that called the patched function: two above this one.
        path, function = _caller(2)
        if not path.startswith(scope):
            return False
        return f"{os.path.relpath(path, scope)}:{function}" not in allow

    def flag(name: str) -> None:
        if record is not None:
            record.append((name, "".join(traceback.format_stack(sys._getframe(2), limit=4))))
            return
        raise HostSync(f"{name} synchronizes the host with the device")

    def patch(owner, name: str, wrap) -> None:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, wrap(original, name))

    def always(original, name):
        def f(*args, **kwargs):
            if _caller_in():
                flag(name)
            return original(*args, **kwargs)

        return f

    def without_output_size(original, name):
        def f(*args, **kwargs):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if (
                isinstance(repeats, torch.Tensor)
                and kwargs.get("output_size") is None
                and _caller_in()
            ):
                flag(f"{name} without output_size")
            return original(*args, **kwargs)

        return f

    def with_device(original, name):
        def f(*args, **kwargs):
            if kwargs.get("device") is not None and _caller_in():
                flag(f"{name}(..., device=...) (a host-to-device copy)")
            return original(*args, **kwargs)

        return f

    def getitem(original, name):
        def f(self, index):
            if _bool_index(index) and _caller_in():
                flag("boolean-mask indexing")
            return original(self, index)

        return f

    def setitem(original, name):
        def f(self, index, value):
            if _bool_index(index) and _caller_in():
                flag("boolean-mask assignment")
            return original(self, index, value)

        return f

    try:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            patch(T, name, always)
        for name in ("nonzero", "unique", "bincount", "masked_select", "argwhere", "numpy"):
            patch(T, name, always)
            if hasattr(torch, name):
                patch(torch, name, always)
        patch(T, "repeat_interleave", without_output_size)
        patch(torch, "repeat_interleave", without_output_size)
        patch(torch, "tensor", with_device)
        patch(T, "__getitem__", getitem)
        patch(T, "__setitem__", setitem)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


# What torch's sync debug mode warns at each synchronizing call; its one-time
# notice that the mode is a prototype (the first use in a process) is no call.
SYNC_WARNING = "called a synchronizing CUDA operation"


def cuda_syncs(fn) -> int:
    """Synchronizing CUDA calls ``fn()`` makes, as torch's sync debug mode
    counts them (the GPU's own count, where ``forbid_host_syncs`` is the
    CPU's stand-in): the warnings of the calling thread only (the debug mode
    is the process's; another thread's reads are not ``fn``'s)."""
    import gc
    import threading
    import warnings

    caught = []
    me = threading.get_ident()

    def show(message, *args, **kwargs) -> None:
        if threading.get_ident() == me:
            caught.append(message)

    # Garbage of earlier tests collected inside ``fn`` (a CUDA graph and its
    # memory pool freed) would count as ``fn``'s: collected before, not during.
    gc.collect()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        gc.disable()
        try:
            fn()
        finally:
            gc.enable()
            torch.cuda.set_sync_debug_mode("default")
    return sum(SYNC_WARNING in str(m) for m in caught)


@contextlib.contextmanager
def cuda_syncs_raise():
    """On a GPU: within the block, a synchronizing CUDA call raises
    (``torch.cuda.set_sync_debug_mode("error")``), after the work queued
    before it is done."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")

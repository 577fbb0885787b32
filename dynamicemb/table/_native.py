"""Loads the native extension and exposes the table's constants.

The numbers (reserved keys, score policies, statuses, tensor columns,
initializer modes, optimizer types and fields, dist types) are defined once, in
C++ (``cc/table/types.h``, ``cc/embedding``, ``cc/routing``); this module only
reads them from the extension (``dynamicemb._C.constants()``), so Python never
restates them.
"""

import enum
import functools
from typing import Any

import torch


@functools.cache
def extension():
    """The ``dynamicemb._C`` module; importing it registers ``torch.ops.dynamicemb``."""
    try:
        from dynamicemb import _C  # type: ignore[attr-defined]
    except ImportError as e:  # pragma: no cover - exercised only on broken installs
        raise ImportError(
            "dynamicemb's native extension is not built. Build it with "
            "`pip install --no-build-isolation .` (or `python setup.py build_ext --inplace`) "
            "or through Bazel (`bazel build //dynamicemb:_C.so`)."
        ) from e
    return _C


@functools.cache
def constants() -> dict[str, Any]:
    return dict(extension().constants())


def _int_enum(name: str) -> type:
    members = constants()[name]
    return enum.IntEnum(name, {k: int(v) for k, v in members.items()})


class _Enums:
    """The C++ enumerations as ``enum.IntEnum`` classes, built from the
    extension's constants on first use (``enums.InsertStatus.FOUND``, ...),
    all at once, and kept as plain attributes: torch.compile reads them like
    constants (a table's construction has built them before any trace)."""

    NAMES = (
        "ScorePolicy",
        "InsertStatus",
        "TableMode",
        "InfoCol",
        "CounterCol",
        "RunOp",
        "Admission",
    )

    def __getattr__(self, name: str) -> type:
        if name not in self.NAMES:
            raise AttributeError(f"dynamicemb has no native enumeration {name!r}")
        for n in self.NAMES:
            setattr(self, n, _int_enum(n))
        return self.__dict__[name]


enums = _Enums()


def ops():
    extension()
    return torch.ops.dynamicemb

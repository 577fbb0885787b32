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
    """Enumerations built from the C++ definitions on first use."""

    @functools.cached_property
    def ScorePolicy(self):
        return _int_enum("ScorePolicy")

    @functools.cached_property
    def InsertStatus(self):
        return _int_enum("InsertStatus")

    @functools.cached_property
    def TableMode(self):
        return _int_enum("TableMode")

    @functools.cached_property
    def InfoCol(self):
        return _int_enum("InfoCol")

    @functools.cached_property
    def CounterCol(self):
        return _int_enum("CounterCol")

    @functools.cached_property
    def RunOp(self):
        return _int_enum("RunOp")


enums = _Enums()


def ops():
    extension()
    return torch.ops.dynamicemb

"""Argument helpers of ``ScoredHashTable``: per-table options, int lists,
flags."""

from collections.abc import Sequence

import torch

from dynamicemb._checks import as_int

IntOrSeq = int | Sequence[int]

# A call's ``scores``, the values its ASSIGN score words take: one int for
# every word, one int per word, or an int64 tensor of one row or one row per
# key, num_scores wide (ScoredHashTable._scores reads it).
ScoreValues = int | Sequence[int] | torch.Tensor

INT64_MIN = -(2**63)


def _per_table(value: IntOrSeq, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} tables")
        return list(value)
    return [value] * n


def _ints(values, name: str, n: int | None = None, min: int | None = None) -> list[int]:
    """A sequence of ints (exactly ``n`` when given), each at least ``min``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {values!r}")
    if n is not None and len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries for {n} tables")
    return [as_int(v, f"{name}[{i}]", min=min) for i, v in enumerate(values)]


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def _optional_ints(value, n: int, name: str, min: int) -> list[int | None]:
    """A per-table option: None, one int for every table, or one per table."""
    out = _per_table(value, n, name)
    return [
        None if v is None else as_int(v, f"{name}[{t}]" if n > 1 else name, min=min)
        for t, v in enumerate(out)
    ]

"""Argument helpers of ``ScoredHashTable``: per-table options, int lists,
flags, score values and per-slot arrays."""

from collections.abc import Sequence

import torch

from dynamicemb._checks import as_int, as_tensor, is_int

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


def _per_slot(
    x: torch.Tensor, name: str, dtype: torch.dtype, num_slots: int, device
) -> torch.Tensor:
    """A (num_slots) tensor of ``dtype`` argument, on ``device``, contiguous
    and 8-byte aligned (the tiles read masks eight slots at a time)."""
    as_tensor(x, name, dtypes=(dtype,))
    if x.shape != (num_slots,):
        raise ValueError(
            f"{name} must have one entry per slot ({num_slots}), got shape {tuple(x.shape)}"
        )
    x = x.to(device).contiguous()
    return x if x.data_ptr() % 8 == 0 else x.clone()


def _score_values(scores: ScoreValues | None, n: int, w: int, device) -> torch.Tensor:
    """A call's ``scores`` (ScoreValues) as the (1 or n, w) int64 tensor the
    ops read, on ``device``."""
    if isinstance(scores, torch.Tensor):
        as_tensor(scores, "scores", dtypes=(torch.int64,))
        if scores.dim() > 2:
            raise ValueError(f"scores must be 1-D or 2-D, got shape {tuple(scores.shape)}")
        values = scores.reshape(-1, w) if scores.dim() < 2 else scores
        if values.shape[1] != w:
            raise ValueError(
                f"scores must have {w} values per row, got shape {tuple(scores.shape)}"
            )
        if values.shape[0] not in (1, n):
            raise ValueError(f"scores must have 1 or {n} rows, got {values.shape[0]}")
        return values.to(device).contiguous()
    if scores is None:
        vals = [0] * w
    elif is_int(scores):
        vals = [int(scores)] * w
    else:
        vals = _ints(scores, "scores")
        if len(vals) != w:
            raise ValueError(f"expected {w} score values, got {len(vals)}")
    for v in vals:
        if not INT64_MIN <= v < 2**63:
            raise ValueError(f"score {v} does not fit int64")
    # Built on the device with fills: a host tensor copied to the GPU would
    # synchronize the stream on every call.
    values = torch.full((1, w), vals[0], dtype=torch.int64, device=device)
    for c in range(1, w):
        if vals[c] != vals[0]:
            values[0, c].fill_(vals[c])
    return values

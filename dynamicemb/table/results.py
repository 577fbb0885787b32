"""What the table's operations return: inserted slots with their statuses,
evicted keys, exported slots; and ``gather_rows``."""

import dataclasses
from dataclasses import dataclass

import torch

from dynamicemb.table._native import ops


class _CountedBatch:
    """A dataclass of tensors whose first ``count[0]`` entries are valid."""

    def compact(self, count: int | None = None):
        """The valid prefix of every tensor: views. ``count``: the count, when
        the caller read it already (else it is read: synchronizes on CUDA)."""
        n = int(self.count.item()) if count is None else count
        names = [f.name for f in dataclasses.fields(self) if f.name != "count"]
        return dataclasses.replace(self, **{name: getattr(self, name)[:n] for name in names})


@dataclass
class EvictedKeys(_CountedBatch):
    """Keys an insert_and_evict pushed out, in (bucket, batch index) order.

    Attributes:
        keys (torch.Tensor): (n) int64, valid up to ``count``.
        scores (torch.Tensor): (n, num_scores) int64, the scores they had.
        slots (torch.Tensor): (n) int64, the slots they held (now the new keys').
        table_ids (torch.Tensor): (n) int64.
        count (torch.Tensor): (1) int64 on the table's device.
    """

    keys: torch.Tensor
    scores: torch.Tensor
    slots: torch.Tensor
    table_ids: torch.Tensor
    count: torch.Tensor


@dataclass
class InsertResult:
    """Per-key result of insert / insert_and_evict.

    Attributes:
        slots (torch.Tensor): (n) int64 slot of each key, -1 where not stored.
        status (torch.Tensor): (n) int8, ``enums.InsertStatus`` values.
        evicted (EvictedKeys): the keys evicted to make room.
    """

    slots: torch.Tensor
    status: torch.Tensor
    evicted: EvictedKeys


@dataclass
class ExportedBatch(_CountedBatch):
    """Occupied slots selected by export_batch, in slot order (first ``count``)."""

    keys: torch.Tensor
    slots: torch.Tensor
    table_ids: torch.Tensor
    scores: torch.Tensor
    count: torch.Tensor


def gather_rows(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``out[i] = values[rows[i]]``, zeros where ``rows[i]`` is -1.

    Args:
        values (torch.Tensor): (num_rows, dim), contiguous, any dtype.
        rows (torch.Tensor): (n) int64 on the same device, e.g. slots from
            ``ScoredHashTable.find`` (or ``rows()`` under NO_EVICTION).

    Returns:
        torch.Tensor: (n, dim) of values' dtype.
    """
    return ops().gather_rows(values, rows)

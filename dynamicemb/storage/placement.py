"""Where a hash table's rows are: how many slots and rows each table starts
with, and which of its rows are in the device segment of the row space and
which in the host segment (a budget of device bytes per table)."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dynamicemb.dynamicemb_config import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbTableOptions,
)
from dynamicemb.storage.layout import RowLayout
from dynamicemb.table import no_eviction_key_slots


def align(n: int, width: int | None) -> int:
    """n rounded up to a multiple of the bucket width (16 for one bucket)."""
    a = width or BUCKET_ALIGNMENT
    return -(-n // a) * a


def bucket_widths(options: Sequence[DynamicEmbTableOptions]) -> list[int | None]:
    """Each table's bucket width, None for one bucket spanning the table."""
    return [
        o.bucket_capacity if o.bucket_capacity != MAX_BUCKET_CAPACITY else None for o in options
    ]


def initial_layout(
    options: Sequence[DynamicEmbTableOptions], no_eviction: bool
) -> tuple[list[int], list[int]]:
    """(key map slots, value rows) per table at creation: ``init_capacity``
    (default ``max_capacity``) rows; a NO_EVICTION key map of
    ``no_eviction_key_slots`` of them, in whole buckets."""
    rows = [int(o.init_capacity or o.max_capacity) for o in options]
    if not no_eviction:
        return rows, rows
    return [align(no_eviction_key_slots(r), w) for r, w in zip(rows, bucket_widths(options))], rows


def device_rows(rows: Sequence[int], row_bytes: Sequence[int], budgets: Sequence[int]) -> list[int]:
    """Rows of each table kept in device memory: as many as its budget holds."""
    return [min(r, b // rb) for r, rb, b in zip(rows, row_bytes, budgets)]


@dataclass
class Placement:
    """Where each table's rows are: table t's local row r is in the device
    segment at ``dev_base[t] + r * row_bytes[t]`` when ``r < dev_rows[t]``,
    else in the host segment at ``host_base[t] + (r - dev_rows[t]) *
    row_bytes[t]`` (offset ``size0 +`` that in the row space)."""

    rows: list[int]
    dev_rows: list[int]
    dev_base: list[int]
    host_base: list[int]
    size0: int
    size1: int
    params: torch.Tensor  # (tables, 4): row_bytes, dev_rows, dev_base, host_base + size0

    @staticmethod
    def of(rows: Sequence[int], layout: RowLayout, budgets, device) -> "Placement":
        dev = device_rows(rows, layout.row_bytes, budgets)
        dev_base, host_base = [0], [0]
        for r, d, rb in zip(rows, dev, layout.row_bytes):
            dev_base.append(dev_base[-1] + d * rb)
            host_base.append(host_base[-1] + (r - d) * rb)
        size0, size1 = dev_base[-1], host_base[-1]
        t = [
            layout.row_bytes,
            dev,
            dev_base[:-1],
            [h + size0 for h in host_base[:-1]],
        ]
        return Placement(
            list(rows),
            dev,
            dev_base[:-1],
            host_base[:-1],
            size0,
            size1,
            torch.tensor(t, dtype=torch.int64, device=device).t().contiguous(),
        )

    def one_tier(self) -> bool:
        """Every row of every table in one segment."""
        return all(d == r for d, r in zip(self.dev_rows, self.rows)) or not any(self.dev_rows)

    def offsets(self, local: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Byte offsets of tables' local rows (-1 stays -1)."""
        p = self.params[tids]
        rb, dev, dev_base, host_base = p.unbind(1)
        off = torch.where(local < dev, dev_base + local * rb, host_base + (local - dev) * rb)
        return torch.where(local >= 0, off, local)

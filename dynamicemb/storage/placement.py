"""Where a hash table's rows are: how many slots and rows each table starts
with, and which of its rows are in the device segment of the row space and
which in the host segment (a budget of device bytes per table); for a table
split between the two, the row map (``Remap``) that lets rows move between
them."""

import dataclasses
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


def split_table(rows: int, dev_rows: int) -> bool:
    """Whether a table of ``rows`` rows keeps ``dev_rows`` of them in device
    memory and the others in host memory."""
    return 0 < dev_rows < rows


def remap_bytes(rows: int, dev_rows: int) -> int:
    """Bytes of a split table's row map (``Remap``): a byte offset per row,
    an owner (int64) and a reference mark (int32) per device row, the
    clock's hand; 0 for a table in one tier."""
    if not split_table(rows, dev_rows):
        return 0
    return rows * 8 + dev_rows * 12 + 8


@dataclass
class Remap:
    """Where the rows of the split tables are: the byte offset of each row,
    which the storage may move between the device rows and the host rows
    (a hot row into device memory, a cold one out: ``HybridStorage``).

    Table t's row r (``base[t] >= 0``: t is split) is at ``where[base[t] +
    r]``. Its ``dev_rows[t]`` device rows are, in order, ``owner[dev_base[t]
    :][:dev_rows[t]]``: the map index of the row each holds; ``ref`` marks
    the device rows used since the clock's ``hand[t]`` last passed them.
    Starts as the identity: row r on the device when r < dev_rows[t].
    """

    base: torch.Tensor  # (tables) int64, -1 for a table in one tier
    dev_base: torch.Tensor  # (tables) int64, -1 likewise
    split: torch.Tensor  # (tables) int64: the table's ordinal among the split ones, -1
    tables: torch.Tensor  # (split tables) int64: their ids
    where: torch.Tensor  # (rows of the split tables) int64 byte offsets
    owner: torch.Tensor  # (device rows of the split tables) int64
    ref: torch.Tensor  # (device rows of the split tables) int32
    hand: torch.Tensor  # (split tables) int64, a device row of each

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The state (what ``remap_bytes`` counts)."""
        return (self.where, self.owner, self.ref, self.hand)

    def copy(self) -> "Remap":
        return Remap(
            self.base,
            self.dev_base,
            self.split,
            self.tables,
            *(x.clone() for x in self.tensors()),
        )

    def put(self, other: "Remap") -> None:
        """Copies ``other``'s state (a ``copy`` of this map) back in."""
        for x, y in zip(self.tensors(), other.tensors()):
            x.copy_(y)


@dataclass
class Placement:
    """Where each table's rows are: table t's local row r is in the device
    segment at ``dev_base[t] + r * row_bytes[t]`` when ``r < dev_rows[t]``,
    else in the host segment at ``host_base[t] + (r - dev_rows[t]) *
    row_bytes[t]`` (offset ``size0 +`` that in the row space); the rows of a
    split table, where ``remap`` says (that, until a row moves)."""

    rows: list[int]
    dev_rows: list[int]
    dev_base: list[int]
    host_base: list[int]
    size0: int
    size1: int
    params: torch.Tensor  # (tables, 4): row_bytes, dev_rows, dev_base, host_base + size0
    remap: Remap | None = None

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
        p = Placement(
            list(rows),
            dev,
            dev_base[:-1],
            host_base[:-1],
            size0,
            size1,
            torch.tensor(t, dtype=torch.int64, device=device).t().contiguous(),
        )
        p.remap = _identity_remap(p, device)
        return p

    def one_tier(self) -> bool:
        """Every row of every table in one segment."""
        return all(d == r for d, r in zip(self.dev_rows, self.rows)) or not any(self.dev_rows)

    def formula(self, local: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Byte offsets of tables' local rows (>= 0) before any row moved."""
        p = self.params[tids]
        rb, dev, dev_base, host_base = p.unbind(1)
        return torch.where(local < dev, dev_base + local * rb, host_base + (local - dev) * rb)

    def offsets(self, local: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Byte offsets of tables' local rows (-1 stays -1)."""
        off = self.formula(local, tids)
        if self.remap is not None:
            base = self.remap.base[tids]
            moved = self.remap.where[(base + local).clamp(min=0)]
            off = torch.where(base >= 0, moved, off)
        return torch.where(local >= 0, off, local)

    def map_index(self, local: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Each row's entry of ``remap.where`` (-1: its table is not split, or
        no row)."""
        base = self.remap.base[tids]
        return torch.where((base >= 0) & (local >= 0), base + local, -1)

    def remap_bytes(self) -> list[int]:
        """``remap_bytes`` of each table."""
        return [remap_bytes(r, d) for r, d in zip(self.rows, self.dev_rows)]

    def snapshot(self) -> "Placement":
        """A copy whose row map (the part that changes in place) is its own."""
        if self.remap is None:
            return self
        return dataclasses.replace(self, remap=self.remap.copy())


def _identity_remap(p: Placement, device) -> Remap | None:
    """The row map of a new placement's split tables (every row where ``p``
    puts it), or None when no table is split."""
    split = [split_table(r, d) for r, d in zip(p.rows, p.dev_rows)]
    if not any(split):
        return None
    base, dbase, at, dat = [], [], 0, 0
    for r, d, s in zip(p.rows, p.dev_rows, split):
        base.append(at if s else -1)
        dbase.append(dat if s else -1)
        at, dat = at + (r if s else 0), dat + (d if s else 0)
    split_t = torch.tensor(split, dtype=torch.bool, device=device)
    tables = torch.arange(len(split), dtype=torch.int64, device=device)
    rows_t = torch.tensor(p.rows, dtype=torch.int64, device=device)
    dev_t = torch.tensor(p.dev_rows, dtype=torch.int64, device=device)
    base_t = torch.tensor(base, dtype=torch.int64, device=device)
    dbase_t = torch.tensor(dbase, dtype=torch.int64, device=device)
    tids = torch.repeat_interleave(tables, torch.where(split_t, rows_t, 0), output_size=at)
    local = torch.arange(at, dtype=torch.int64, device=device) - base_t[tids]
    dev_tids = torch.repeat_interleave(tables, torch.where(split_t, dev_t, 0), output_size=dat)
    owner = torch.arange(dat, dtype=torch.int64, device=device)
    owner = owner - dbase_t[dev_tids] + base_t[dev_tids]
    ordinal = (torch.cumsum(split_t.to(torch.int64), 0) - 1).masked_fill(~split_t, -1)
    return Remap(
        base_t,
        dbase_t,
        ordinal,
        torch.tensor([t for t, x in enumerate(split) if x], dtype=torch.int64, device=device),
        p.formula(local, tids),
        owner,
        torch.zeros(dat, dtype=torch.int32, device=device),
        torch.zeros(sum(split), dtype=torch.int64, device=device),
    )

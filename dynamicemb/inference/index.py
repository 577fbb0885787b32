"""The key -> row index of an inference table: sorted keys, searched.

The index of a group of tables holds, sorted by (key, table)::

    keys    (N + 1) int64   the keys, then a sentinel (the largest int64)
    tables  (N + 1) int32   each key's table in the group, then the largest
                            int32; absent when the group has one table
    slots   (N + 1) int32   each key's row in the group's row storage
                            (int64 when the storage has 2**31 rows or more)

A lookup of (key, table) is ``torch.searchsorted`` over the keys, the lower
bound of the key, then, for a group of T tables, ``ceil(log2(T + 1))``
halvings of the window of T entries from there (a key is held by at most T
tables, each once), the lower bound of (key, table). Every step is a torch
op over the batch, so a lookup exports (``torch.export``) and compiles
(``torch.compile(fullgraph=True)``) as plain ATen, on any device, and the
index costs 12 bytes a key (8 with one table), against at least 34 for a
scored hash table at its largest load of a half (docs/benchmarks/inference.md
measures both). The sentinel keeps every search inside the arrays: the
lower bound of any key is at most N.

An index is immutable. A change (``merged``) builds a new one aside: the
kept entries and the new ones, merged in order by the same search.
"""

from dataclasses import dataclass

import torch

__all__ = ["Index", "lower_bound"]

_KEY_END = torch.iinfo(torch.int64).max
_TABLE_END = torch.iinfo(torch.int32).max
_INT32_SLOTS = torch.iinfo(torch.int32).max


def window_steps(num_tables: int) -> int:
    """Halvings that find a table among ``num_tables`` entries of one key."""
    return 0 if num_tables <= 1 else int(num_tables).bit_length()


# The gathers here are index_select: x.index_select(0, i) is plain ATen as x[i]
# is, and an order of magnitude faster on the CPU (0.4 against 5 ms for 163,840
# int64 entries of 4M, one thread).


def lower_bound(
    keys: torch.Tensor,
    tables: torch.Tensor | None,
    query: torch.Tensor,
    query_tables: torch.Tensor | None,
    num_tables: int,
) -> torch.Tensor:
    """(n) int64: the first entry not below each (key, table) of the query
    (the table ignored without ``tables``), at most N (the sentinel)."""
    pos = torch.searchsorted(keys, query)
    if tables is None:
        return pos
    end = keys.shape[0] - 1
    lo, hi = pos, torch.clamp(pos + num_tables, max=end)
    for _ in range(window_steps(num_tables)):
        mid = (lo + hi) >> 1
        k = keys.index_select(0, mid)
        less = (k < query) | ((k == query) & (tables.index_select(0, mid) < query_tables))
        go = less & (mid < hi)
        lo = torch.where(go, mid + 1, lo)
        hi = torch.where(go, hi, mid)
    return lo


@dataclass(frozen=True)
class Index:
    """The index of a group of ``num_tables`` tables (see the module
    docstring)."""

    keys: torch.Tensor
    tables: torch.Tensor | None
    slots: torch.Tensor
    num_tables: int

    @property
    def size(self) -> int:
        """Keys held (the sentinel aside)."""
        return self.keys.shape[0] - 1

    @property
    def nbytes(self) -> int:
        parts = [self.keys, self.slots] + ([] if self.tables is None else [self.tables])
        return sum(t.numel() * t.element_size() for t in parts)

    def find(
        self, query: torch.Tensor, query_tables: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(entry, found): each query's entry (its lower bound) and whether
        it holds the query's key (and table)."""
        pos = lower_bound(self.keys, self.tables, query, query_tables, self.num_tables)
        found = (self.keys.index_select(0, pos) == query) & (pos < self.keys.shape[0] - 1)
        if self.tables is not None:
            found &= self.tables.index_select(0, pos) == query_tables
        return pos, found

    def locate(
        self, query: torch.Tensor, query_tables: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot, found): each query's slot (int64, meaningless where not
        found) and whether the index holds it. The queries are searched in
        key order: neighbours walk the same path down the sorted keys, so
        most of a search reads memory the previous one read (on the CPU,
        about 3x faster than in batch order for a million keys or more)."""
        ordered, order = torch.sort(query)
        tables = None if query_tables is None else query_tables.index_select(0, order)
        pos, found = self.find(ordered, tables)
        # Back to batch order (scatter: an exported program takes any size).
        slots = torch.empty_like(pos).scatter_(0, order, self.slots.index_select(0, pos).long())
        hit = torch.empty_like(found).scatter_(0, order, found)
        return slots, hit

    @classmethod
    def build(
        cls, keys: torch.Tensor, tables: torch.Tensor, slots: torch.Tensor, num_tables: int
    ) -> "Index":
        """The index of entries (key, table, slot), in any order; the
        (key, table) pairs must be distinct."""
        order = _lexsort(keys, tables)
        return cls._of(keys[order], tables[order], slots[order], num_tables)

    @staticmethod
    def _of(keys, tables, slots, num_tables) -> "Index":
        device = keys.device
        wide = slots.numel() and int(slots.max()) > _INT32_SLOTS
        slot_dtype = torch.int64 if wide else torch.int32
        keys = torch.cat([keys, torch.tensor([_KEY_END], dtype=torch.int64, device=device)])
        slots = torch.cat([slots.to(slot_dtype), torch.zeros(1, dtype=slot_dtype, device=device)])
        if num_tables > 1:
            end = torch.tensor([_TABLE_END], dtype=torch.int32, device=device)
            tables = torch.cat([tables.to(torch.int32), end])
        else:
            tables = None
        return Index(keys, tables, slots, num_tables)

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys, tables, slots) of every entry, in order (tables int64)."""
        n = self.size
        tables = (
            torch.zeros(n, dtype=torch.int64, device=self.keys.device)
            if self.tables is None
            else self.tables[:n].long()
        )
        return self.keys[:n], tables, self.slots[:n].long()

    def merged(
        self,
        drop: torch.Tensor,
        keys: torch.Tensor,
        tables: torch.Tensor,
        slots: torch.Tensor,
    ) -> "Index":
        """A new index: this one's entries but those ``drop`` ((N) bool)
        marks, and the entries (key, table, slot) of keys it does not keep,
        in any order."""
        old_keys, old_tables, old_slots = self.entries()
        keep = ~drop
        kept = self._of(old_keys[keep], old_tables[keep], old_slots[keep], self.num_tables)
        order = _lexsort(keys, tables)
        keys, tables, slots = keys[order], tables[order], slots[order]
        at = lower_bound(kept.keys, kept.tables, keys, tables.to(torch.int32), self.num_tables)
        at = at + torch.arange(keys.numel(), device=keys.device)
        n = kept.size + keys.numel()
        new = torch.zeros(n, dtype=torch.bool, device=keys.device)
        new[at] = True
        out_keys = torch.empty(n, dtype=torch.int64, device=keys.device)
        out_tables = torch.empty(n, dtype=torch.int64, device=keys.device)
        out_slots = torch.empty(n, dtype=torch.int64, device=keys.device)
        kept_keys, kept_tables, kept_slots = kept.entries()
        for out, old, add in (
            (out_keys, kept_keys, keys),
            (out_tables, kept_tables, tables),
            (out_slots, kept_slots, slots),
        ):
            out[new] = add
            out[~new] = old
        return self._of(out_keys, out_tables, out_slots, self.num_tables)


def _lexsort(keys: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The order of (key, table) pairs: by table, then stably by key."""
    by_table = torch.argsort(tables, stable=True)
    return by_table[torch.argsort(keys[by_table], stable=True)]

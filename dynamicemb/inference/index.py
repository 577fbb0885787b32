"""The key -> row index of an inference table: sorted keys, searched.

The index of a group of tables holds, sorted by (key, table)::

    keys    (N + 1) int64   the keys, then a sentinel (the largest int64)
    tables  (N + 1) int32   each key's table in the group, then the largest
                            int32; absent when the group has one table
    masks   (N + 1)         the tables that hold each entry's key, bit t for
                            table t (0 for the sentinel): uint8 for up to 8
                            tables, int16, int32 or int64 for up to 16, 32 or
                            63; absent with one table or more than 63
    slots   (N + 1) int32   each key's row in the group's row storage
                            (int64 when the storage has 2**31 rows or more)

A lookup of (key, table) is ``torch.searchsorted`` over the keys, the lower
bound of the key: the first of its entries, one a table that holds it, in
table order. With ``masks``, the entry of table t lies as many entries
further as the key's mask has bits below t, and the key is there when its
mask has bit t. Without masks, for a group of T tables, ``ceil(log2(T + 1))``
halvings of the window of T entries from the key's lower bound (a key is
held by at most T tables, each once) find the lower bound of (key, table).
Every step is a torch op over the batch, so a lookup exports
(``torch.export``) and compiles (``torch.compile(fullgraph=True)``) as plain
ATen, on any device. The index costs 12 bytes a key with one table (its key
and slot), 16 with more (its table), and its mask's 1 to 8 more with 2 to 63
tables, against at least 34 for a scored hash table at its largest load of
a half (docs/benchmarks/inference.md measures both). The sentinel keeps
every search inside the arrays: the lower bound of any key is at most N.

An index is immutable. A change (``merged``) builds a new one aside: the
kept entries and the new ones, merged in order by the same search.
"""

from dataclasses import dataclass

import torch

__all__ = ["Index", "lower_bound"]

_KEY_END = torch.iinfo(torch.int64).max
_TABLE_END = torch.iinfo(torch.int32).max
_INT32_SLOTS = torch.iinfo(torch.int32).max


# The widest mask: bit t of an int64 for table t < 63 (a shift by 63 would
# reach the sign bit).
_MASK_TABLES = 63
# Bits of each table a key's mask can hold, by its dtype.
_MASK_DTYPES = ((8, torch.uint8), (16, torch.int16), (32, torch.int32), (63, torch.int64))


def mask_dtype(num_tables: int) -> torch.dtype | None:
    """The dtype of a group's ``masks`` (None: the group has none)."""
    if num_tables <= 1 or num_tables > _MASK_TABLES:
        return None
    return next(d for bits, d in _MASK_DTYPES if num_tables <= bits)


def entry_bytes(num_tables: int) -> int:
    """Bytes an entry of a group of ``num_tables`` tables takes: its key, its
    slot (int32), its table and its mask where the group has them."""
    if num_tables <= 1:
        return 8 + 4
    dtype = mask_dtype(num_tables)
    return 8 + 4 + 4 + (0 if dtype is None else dtype.itemsize)


def key_masks(keys: torch.Tensor, tables: torch.Tensor, num_tables: int) -> torch.Tensor:
    """(N + 1) masks of sorted entries (``keys`` and int64 ``tables`` with
    their sentinels): each entry's bit t set where table t holds its key."""
    n = keys.shape[0]
    start = torch.ones(n, dtype=torch.bool, device=keys.device)
    start[1:] = keys[1:] != keys[:-1]
    run = torch.cumsum(start.long(), 0) - 1
    bits = torch.bitwise_left_shift(torch.ones_like(tables), tables.clamp(max=_MASK_TABLES - 1))
    bits[-1] = 0  # the sentinel
    # The tables of a key are distinct: their bits' sum is their union.
    per_run = torch.zeros(n, dtype=torch.int64, device=keys.device).index_add_(0, run, bits)
    return per_run.index_select(0, run).to(mask_dtype(num_tables))


def _bits_below(masks: torch.Tensor, at: torch.Tensor, table: torch.Tensor, num_tables: int):
    """(mask, below) of entries ``at``: each one's mask (int64) and the number
    of its bits below ``table`` (int64, in [0, num_tables))."""
    # Bits at and above num_tables (an int16 or int32 mask's sign, extended)
    # are never read: only those below ``table`` are counted.
    m = masks.index_select(0, at).long()
    x = m & (torch.bitwise_left_shift(torch.ones_like(table), table) - 1)
    # The bits of x (below 2**63) counted in place: pairs, nibbles, then
    # bytes summed as far as the group's tables reach.
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    for shift in (8, 16, 32):
        if num_tables > shift:
            x = x + (x >> shift)
    return m, x & 0x7F


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
    masks: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """Keys held (the sentinel aside)."""
        return self.keys.shape[0] - 1

    @property
    def nbytes(self) -> int:
        parts = [self.keys, self.slots, self.tables, self.masks]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def find(
        self, query: torch.Tensor, query_tables: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(entry, found): each query's entry where found (meaningless
        elsewhere), and whether the index holds its key (and table)."""
        if self.masks is not None and query_tables is not None:
            return self._find_by_masks(query, query_tables)
        pos = lower_bound(self.keys, self.tables, query, query_tables, self.num_tables)
        found = self._holds_key(pos, query)
        if self.tables is not None:
            found &= self.tables.index_select(0, pos) == query_tables
        return pos, found

    def _holds_key(self, pos: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Whether entry ``pos`` of each query holds its key (the sentinel
        holds none)."""
        return (self.keys.index_select(0, pos) == query) & (pos < self.keys.shape[0] - 1)

    def _find_by_masks(
        self, query: torch.Tensor, query_tables: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """find through the keys' masks (see the module docstring)."""
        pos = torch.searchsorted(self.keys, query)
        t = query_tables.long()
        ok = (t >= 0) & (t < self.num_tables)
        t = torch.where(ok, t, 0)
        m, below = _bits_below(self.masks, pos, t, self.num_tables)
        found = self._holds_key(pos, query) & ok & ((m >> t) & 1 == 1)
        return pos + below, found

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
        masks = None
        if num_tables > 1:
            end = torch.tensor([_TABLE_END], dtype=torch.int32, device=device)
            tables = torch.cat([tables.to(torch.int32), end])
            if mask_dtype(num_tables) is not None:
                masks = key_masks(keys, tables.long(), num_tables)
        else:
            tables = None
        return Index(keys, tables, slots, num_tables, masks)

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

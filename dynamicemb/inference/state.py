"""What an inference table holds, as one immutable object: per group of
tables of one dim, the index (index.py) and the row storage; per table, its
position in a delta stream.

A group's row storage is a tensor of ``capacity`` stored rows (formats.py):
rows ``0 .. T - 1`` are its T tables' default rows (what an unknown key
reads), the rows after them are written once each, in order, up to
``used``. A change never writes a row that an index refers to: a delta's
rows go to rows ``used ..``, past every row any index (this state's, or an
older one a lookup may still hold) refers to, and the new state (a new
index over the same storage) is built aside; the table then swaps one
reference. The rows a change leaves behind (replaced or removed keys) stay
until the storage is full: the next change then compacts, copying the live
rows into a new storage with room to spare.
"""

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dynamicemb.inference.formats import RowFormat
from dynamicemb.inference.index import Index

__all__ = ["Group", "GroupRows", "State"]


@dataclass(frozen=True)
class Group:
    """The tables of one dim, whose rows share a storage (module-level
    constants).

    Attributes:
        dim (int): the tables' dim.
        tables (tuple[int, ...]): the module's tables in the group; a
            table's place in it is its local id (the index's table column).
        fmt (RowFormat): how rows are stored.
    """

    dim: int
    tables: tuple[int, ...]
    fmt: RowFormat

    @property
    def width(self) -> int:
        return self.fmt.width(self.dim)


@dataclass(frozen=True)
class GroupRows:
    """A group's index and row storage (see the module docstring)."""

    index: Index
    storage: torch.Tensor
    used: int

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.storage.numel() * self.storage.element_size()

    @staticmethod
    def allocate(group: Group, defaults: torch.Tensor, rows: int, spare: float) -> torch.Tensor:
        """A storage for ``rows`` rows after the group's tables' ``defaults``
        ((T, width) encoded, written), with room for ``spare`` times as many
        more."""
        t = len(group.tables)
        capacity = t + rows + max(int(rows * spare), 0)
        storage = torch.empty(
            capacity, group.width, dtype=group.fmt.storage, device=defaults.device
        )
        storage[:t] = defaults
        return storage

    @staticmethod
    def indexed(
        group: Group, storage: torch.Tensor, keys: torch.Tensor, tables: torch.Tensor
    ) -> "GroupRows":
        """The group holding the (key, local table) pairs ``keys``,
        ``tables`` whose rows ``storage`` holds in that order after its
        default rows."""
        t, n = len(group.tables), keys.numel()
        slots = torch.arange(t, t + n, dtype=torch.int64, device=keys.device)
        index = Index.build(keys, tables, slots, t)
        _mark_dynamic(index, storage)
        return GroupRows(index, storage, t + n)

    @staticmethod
    def build(
        group: Group,
        defaults: torch.Tensor,
        keys: torch.Tensor,
        tables: torch.Tensor,
        stored: torch.Tensor,
        spare: float,
    ) -> "GroupRows":
        """A group holding rows ``stored`` ((n, width), already encoded) of
        the (key, local table) pairs ``keys``, ``tables``, after its tables'
        ``defaults`` ((T, width) encoded), with room for ``spare`` times as
        many more."""
        storage = GroupRows.allocate(group, defaults, keys.numel(), spare)
        t = len(group.tables)
        storage[t : t + keys.numel()] = stored
        return GroupRows.indexed(group, storage, keys, tables)

    def changed(
        self,
        group: Group,
        keys: torch.Tensor,
        tables: torch.Tensor,
        stored: torch.Tensor,
        removed: torch.Tensor,
        removed_tables: torch.Tensor,
        spare: float,
    ) -> "GroupRows":
        """The group with the (key, local table) pairs ``keys``, ``tables``
        holding ``stored`` (encoded rows) and the pairs ``removed``,
        ``removed_tables`` gone (their default rows read again). Writes rows
        only past ``used`` (or into a new storage)."""
        index = self.index
        drop = torch.zeros(index.size, dtype=torch.bool, device=index.keys.device)
        pos, found = index.find(removed, removed_tables.to(torch.int32))
        drop[pos[found]] = True
        pos, found = index.find(keys, tables.to(torch.int32))
        drop[pos[found]] = True
        m = keys.numel()
        if self.used + m > self.storage.shape[0]:  # compact into a new storage
            old_keys, old_tables, old_slots = index.entries()
            keep = ~drop
            t = len(group.tables)
            rows = GroupRows.build(
                group,
                self.storage[:t],
                torch.cat([old_keys[keep], keys]),
                torch.cat([old_tables[keep], tables]),
                torch.cat([self.storage[old_slots[keep]], stored]),
                spare,
            )
            return rows
        slots = torch.arange(self.used, self.used + m, dtype=torch.int64, device=keys.device)
        self.storage[self.used : self.used + m] = stored
        new_index = index.merged(drop, keys, tables, slots)
        _mark_dynamic(new_index, self.storage)
        return GroupRows(new_index, self.storage, self.used + m)


def _mark_dynamic(index: Index, storage: torch.Tensor) -> None:
    """Sizes that change from one state to the next are not specialized on
    by ``torch.compile``: a swapped state reuses the compiled lookup."""
    for t in (index.keys, index.tables, index.masks, index.slots, storage):
        if t is not None and t.shape[0] > 1:
            torch._dynamo.maybe_mark_dynamic(t, 0)


@dataclass(frozen=True)
class State:
    """Everything a lookup reads, swapped whole.

    Attributes:
        groups (tuple[GroupRows, ...]): per group of the module, its rows.
        positions (tuple[tuple[Optional[dict], Optional[int]], ...]): per
            table, (source, sequence) of the delta stream its rows reflect
            (``StreamReplica.stream_position``).
    """

    groups: tuple[GroupRows, ...]
    positions: tuple[tuple[dict[str, Any] | None, int | None], ...] = field(default=())

    def with_groups(self, groups, positions) -> "State":
        return replace(self, groups=tuple(groups), positions=tuple(positions))

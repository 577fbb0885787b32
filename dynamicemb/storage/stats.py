"""Per-table counters a fused embedding module keeps on its device.

The hash table counts what it does itself (keys stored, inserts, evictions,
insert failures: ``ScoredHashTable.counters``). What the module around it
decides is counted here, in one (num_tables, len(StatCol)) int64 tensor on
the module's device: the keys it looks up, and, from the components that
decide them, the keys admission lets in or turns away and the keys a cache
tier hits or misses.

Counting never synchronizes the host with the device: a count is a tensor
operation queued on the device, and the counters are read only when someone
asks (``dynamicemb.metrics`` reads them when a metrics collection runs).

A component feeds a column in two steps: it declares the column when the
module is built (``feed``), so that a reader can tell "counted, zero so far"
from "not counted here", and it counts every batch (``count_segments`` over
the module's per-table segments of distinct keys, or ``add``):

    stats.feed(StatCol.ADMISSIONS, StatCol.REJECTIONS)        # once
    stats.count_segments(StatCol.ADMISSIONS, admitted, su.table_offsets)
    stats.count_segments(StatCol.REJECTIONS, ~admitted, su.table_offsets)
"""

import enum

import torch


@enum.unique
class StatCol(enum.IntEnum):
    """Columns of ``TableStats.counts`` (all cumulative, per table).

    Attributes:
        LOOKUPS (int): distinct keys of a batch looked up in the table
            (training and eval).
        ADMISSIONS (int): missing keys admission let into the table.
        REJECTIONS (int): missing keys admission turned away.
        CACHE_HITS (int): distinct keys found in the cache tier.
        CACHE_MISSES (int): distinct keys the cache tier did not hold.
        REFUSALS (int): new keys not inserted because they were colder than
            their full bucket's lowest (``refuse_cold_keys``).

    ADMISSIONS and REJECTIONS are next to each other: admission adds both in
    one kernel (``TableStats.add_columns``).
    """

    LOOKUPS = 0
    ADMISSIONS = 1
    REJECTIONS = 2
    CACHE_HITS = 3
    CACHE_MISSES = 4
    REFUSALS = 5


class TableStats:
    """Cumulative per-table counters of one module, on its device.

    Args:
        num_tables (int): logical tables of the module.
        device (torch.device): where the counters live (the module's device).

    Attributes:
        counts (torch.Tensor): (num_tables, len(StatCol)) int64.
        fed (frozenset[StatCol]): the columns something in the module counts;
            LOOKUPS always.
    """

    def __init__(self, num_tables: int, device: torch.device) -> None:
        self.counts = torch.zeros((num_tables, len(StatCol)), dtype=torch.int64, device=device)
        self.fed: frozenset[StatCol] = frozenset({StatCol.LOOKUPS})

    def feed(self, *cols: StatCol) -> None:
        """Declares that the module counts these columns."""
        self.fed = self.fed | {StatCol(c) for c in cols}

    def add(self, col: StatCol, per_table: torch.Tensor) -> None:
        """Adds a (num_tables) int64 count to one column (in place: one
        kernel, where ``+=`` on the column would add and copy back)."""
        self.counts[:, col].add_(per_table)

    def add_columns(self, first: StatCol, per_table: torch.Tensor) -> None:
        """Adds a (num_tables, k) int64 count to the k columns from ``first``
        on, in one kernel."""
        self.counts[:, first : first + per_table.shape[1]].add_(per_table)

    def count_segments(
        self, col: StatCol, mask: torch.Tensor, table_offsets: torch.Tensor
    ) -> torch.Tensor:
        """Adds, per table, the set entries of ``mask`` over keys grouped by
        table (differences of its prefix sums at the tables' bounds: no
        atomic adds into a few counters); returns those counts.

        Args:
            col (StatCol): the column.
            mask (torch.Tensor): (u) bool over keys ordered by table, e.g. the
                distinct keys of ``segmented_unique``.
            table_offsets (torch.Tensor): (num_tables + 1) int64: table t's keys
                are ``mask[table_offsets[t]:table_offsets[t + 1]]``.
        """
        ends = torch.nn.functional.pad(mask.to(torch.int64).cumsum(0), (1, 0))
        per_table = ends[table_offsets].diff()
        self.add(col, per_table)
        return per_table

    def count_lookups(self, table_offsets: torch.Tensor) -> None:
        """LOOKUPS += the distinct keys of each table in a batch."""
        self.add(StatCol.LOOKUPS, table_offsets.diff())

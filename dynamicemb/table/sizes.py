"""The sizes of a table's state: what one slot, one NO_EVICTION free-row
entry and one cell of ``info`` and ``counters`` occupy, and how full a
NO_EVICTION key map is kept."""

import math
from collections.abc import Sequence

import torch

from dynamicemb.table._native import constants

# The dtypes of a table's state tensors (see _allocate): what one slot, one
# NO_EVICTION free-row entry and one cell of `info` and `counters` occupy.
KEY_DTYPE, DIGEST_DTYPE, SCORE_DTYPE, FREE_ROW_DTYPE, TABLE_CELL_DTYPE = (
    torch.int64,
    torch.uint8,
    torch.int64,
    torch.int64,
    torch.int64,
)

# A NO_EVICTION key map is kept at most this full, whatever max_load_factor
# says: it doubles (with its rows) before a batch could fill it further.
NO_EVICTION_LOAD_FACTOR = 0.5


def slot_bytes(num_scores: int) -> int:
    """Bytes of one slot: its key, digest and ``num_scores`` score words."""
    return KEY_DTYPE.itemsize + DIGEST_DTYPE.itemsize + num_scores * SCORE_DTYPE.itemsize


def state_bytes(slots: Sequence[int], num_scores: int, free_rows: int) -> int:
    """Bytes of a table's state tensors: ``slots[t]`` slots of table t, their
    ``num_scores`` score words, one row of ``info`` and of ``counters`` per
    table, and ``free_rows`` NO_EVICTION free-row entries."""
    c = constants()
    per_table = (int(c["INFO_COLS"]) + int(c["COUNTER_COLS"])) * TABLE_CELL_DTYPE.itemsize
    return (
        sum(slots) * slot_bytes(num_scores)
        + len(slots) * per_table
        + free_rows * FREE_ROW_DTYPE.itemsize
    )


def no_eviction_key_slots(keys: int) -> int:
    """Slots a NO_EVICTION key map needs to hold ``keys`` keys
    (``NO_EVICTION_LOAD_FACTOR``), before bucket alignment."""
    return math.ceil(keys / NO_EVICTION_LOAD_FACTOR)

"""The scored hash table layer: keys to slots, with per-slot scores."""

from dynamicemb.table._native import constants, enums
from dynamicemb.table.scored_hash_table import (
    FREE_ROW_DTYPE,
    NO_EVICTION_LOAD_FACTOR,
    EvictedKeys,
    ExportedBatch,
    InsertResult,
    ScoredHashTable,
    gather_rows,
    no_eviction_key_slots,
    slot_bytes,
    state_bytes,
)

__all__ = [
    "FREE_ROW_DTYPE",
    "NO_EVICTION_LOAD_FACTOR",
    "EvictedKeys",
    "ExportedBatch",
    "InsertResult",
    "ScoredHashTable",
    "constants",
    "gather_rows",
    "enums",
    "no_eviction_key_slots",
    "slot_bytes",
    "state_bytes",
]

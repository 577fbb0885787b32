"""The scored hash table layer: keys to slots, with per-slot scores."""

from dynamicemb.table._native import constants, enums
from dynamicemb.table.scored_hash_table import (
    EvictedKeys,
    ExportedBatch,
    InsertResult,
    ScoredHashTable,
    gather_rows,
)

__all__ = [
    "EvictedKeys",
    "ExportedBatch",
    "InsertResult",
    "ScoredHashTable",
    "constants",
    "gather_rows",
    "enums",
]

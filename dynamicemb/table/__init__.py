"""The scored hash table layer: keys to slots, with per-slot scores.

This package is the one door to the native extension: only its modules load
``dynamicemb._C`` (``_native.py``). Every other package reaches the
extension's ops, constants and enumerations through the names here:
``ops()`` (``torch.ops.dynamicemb``, registered on first use), ``constants()``
and ``enums`` (the C++ enumerations), ``extension()`` (the module itself),
and the one rule for key values, ``check_keys``.
"""

from dynamicemb.table._native import constants, enums, extension, ops
from dynamicemb.table.keys import check_keys, first_valid_key, pad_key, reserved_key_error
from dynamicemb.table.results import EvictedKeys, ExportedBatch, InsertResult, gather_rows
from dynamicemb.table.scored_hash_table import ScoredHashTable
from dynamicemb.table.sizes import (
    FREE_ROW_DTYPE,
    NO_EVICTION_LOAD_FACTOR,
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
    "check_keys",
    "constants",
    "enums",
    "extension",
    "first_valid_key",
    "gather_rows",
    "no_eviction_key_slots",
    "ops",
    "pad_key",
    "reserved_key_error",
    "slot_bytes",
    "state_bytes",
]

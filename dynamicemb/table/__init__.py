"""The scored hash table layer: keys to slots, with per-slot scores.

This package is the one door to the native extension: only its modules load
``dynamicemb._C`` (``_native.py``). Every other package reaches the
extension's ops, constants and enumerations through the names here:
``ops()`` (``torch.ops.dynamicemb``, registered on first use), ``constants()``
and ``enums`` (the C++ enumerations), ``extension()`` (the module itself),
the one rule for key values, ``check_keys``, and the key of a batch's
padding entries, ``PAD_KEY``; and the victim order for keys the table does
not hold yet, ``keep_order``.
"""

from dynamicemb.table._native import constants, enums, extension, ops
from dynamicemb.table.keys import (
    check_keys,
    first_repeat,
    first_valid_key,
    pad_key,
    reserved_key_error,
)
from dynamicemb.table.results import EvictedKeys, ExportedBatch, InsertResult, gather_rows
from dynamicemb.table.scored_hash_table import ScoredHashTable
from dynamicemb.table.sizes import (
    FREE_ROW_DTYPE,
    NO_EVICTION_LOAD_FACTOR,
    no_eviction_key_slots,
    slot_bytes,
    state_bytes,
)
from dynamicemb.table.victims import keep_order


def __getattr__(name: str):
    # PAD_KEY (``pad_key()``) is read from the extension, which loads on
    # first use: importing this package loads nothing.
    if name == "PAD_KEY":
        return pad_key()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FREE_ROW_DTYPE",
    "PAD_KEY",
    "NO_EVICTION_LOAD_FACTOR",
    "EvictedKeys",
    "ExportedBatch",
    "InsertResult",
    "ScoredHashTable",
    "check_keys",
    "constants",
    "enums",
    "extension",
    "first_repeat",
    "first_valid_key",
    "gather_rows",
    "keep_order",
    "no_eviction_key_slots",
    "ops",
    "pad_key",
    "reserved_key_error",
    "slot_bytes",
    "state_bytes",
]

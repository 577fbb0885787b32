"""dynamicemb: hash-table-backed dynamic embedding tables for TorchRec.

An embedding table whose rows live in a scored, bucketized hash table instead
of a dense tensor: raw 64-bit ids, rows created on first sight, evicted by
score when full, admitted by frequency, spread over device and host memory.

This package imports with torch alone. TorchRec is needed by
``dynamicemb.planner``, ``dynamicemb.shard`` and ``dynamicemb.checkpoint``
(whose ``DynamicEmbDump`` / ``DynamicEmbLoad`` are exported here and
imported on first use); the C++ extension
(``dynamicemb._C``) is loaded by the table layer when a table is built.
"""

from .dynamicemb_config import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbOptimType,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
    ReplayContent,
    get_sharded_table_capacity,
    get_table_value_bytes,
)

# Names exported here but defined in subpackages that need TorchRec: imported
# when first used, so that `import dynamicemb` needs torch alone.
_LAZY = {
    "DynamicEmbDump": "dynamicemb.checkpoint",
    "DynamicEmbLoad": "dynamicemb.checkpoint",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dynamicemb' has no attribute {name!r}")


__all__ = [
    "BUCKET_ALIGNMENT",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbCheckMode",
    "DynamicEmbDump",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbLoad",
    "DynamicEmbOptimType",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "ReplayContent",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
]

"""dynamicemb: hash-table-backed dynamic embedding tables for TorchRec.

An embedding table whose rows live in a scored, bucketized hash table instead
of a dense tensor: raw 64-bit ids, rows created on first sight, evicted by
score when full, admitted by frequency, spread over device and host memory.

This package imports with torch alone. TorchRec is needed by
``dynamicemb.planner`` and ``dynamicemb.shard``; the C++ extension
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

__all__ = [
    "BUCKET_ALIGNMENT",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbCheckMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbOptimType",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "ReplayContent",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
]

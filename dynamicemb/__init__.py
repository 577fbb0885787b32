"""dynamicemb: hash-table-backed dynamic embedding tables for TorchRec.

An embedding table whose rows live in a scored, bucketized hash table instead
of a dense tensor: raw 64-bit ids, rows created on first sight, evicted by
score when full, admitted by frequency, spread over device and host memory.

This package imports with torch alone. TorchRec is needed by
``dynamicemb.planner`` and ``dynamicemb.shard``; the C++ extension
(``dynamicemb._C``) is loaded by the table layer when a table is built. The
provided admission strategies are imported from ``dynamicemb.admission`` when
first named (``from dynamicemb import FrequencyAdmissionStrategy``).
"""

import importlib

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
from .types import (
    AdmissionCount,
    AdmissionStrategy,
    Counter,
    KVCounter,
    MemoryType,
    MultiTableAdmitter,
)

# Names of dynamicemb.admission, imported on first use (it needs the table
# layer, which the configuration modules do not).
_ADMISSION = ("FrequencyAdmissionStrategy", "ProbabilisticAdmissionStrategy")

__all__ = [
    "AdmissionCount",
    "AdmissionStrategy",
    "BUCKET_ALIGNMENT",
    "MAX_BUCKET_CAPACITY",
    "Counter",
    "DynamicEmbCheckMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbOptimType",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "FrequencyAdmissionStrategy",
    "KVCounter",
    "MemoryType",
    "MultiTableAdmitter",
    "ProbabilisticAdmissionStrategy",
    "ReplayContent",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
]


def __getattr__(name: str):
    if name in _ADMISSION:
        return getattr(importlib.import_module(".admission", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

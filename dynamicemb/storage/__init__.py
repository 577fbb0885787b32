"""Storage tiers: where the value rows of dynamic tables live.

The faces a storage shows its callers are declared in ``types.py`` (the
step's rows, the archive, accounting, the delta rows of the hash table that
holds every key, what a cache asks of its backing tier). The embedding module
reaches rows only through ``TableStorage``, built by
``create_storage`` from its tables' options: a hash table whose rows are split
between device and host memory (``HybridStorage``, a ``HashTableStorage``),
or a device cache over a host table or an external ``Storage``
(``CachedStorage``). See
docs/architecture.md, "Storage tiers".

The packages above the embedding module (checkpoints, replication, metrics)
reach a table's rows through ``TableRows`` (``table_rows.py``), which the
module builds over its storage; its per-table counters are ``TableStats``
(``stats.py``).
"""

from dynamicemb.storage.cache import CachedHashStorage, CachedStorage
from dynamicemb.storage.factory import (
    CACHE_BUCKET_CAPACITY,
    cache_layout,
    create_storage,
    plan_footprint,
    table_metadata_bytes,
)
from dynamicemb.storage.hash_storage import HashTableStorage
from dynamicemb.storage.hybrid import HybridStorage
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.scores import BatchScore
from dynamicemb.storage.table_rows import TableRows
from dynamicemb.storage.types import (
    REFUSED_ROW,
    Accounting,
    Archive,
    Backing,
    CacheControl,
    DeltaRows,
    ExportedRows,
    Footprint,
    HashTier,
    HostBacking,
    RowInit,
    StepGraphs,
    StepRows,
    TableStorage,
    by_memory,
)

__all__ = [
    "CACHE_BUCKET_CAPACITY",
    "REFUSED_ROW",
    "Accounting",
    "Archive",
    "Backing",
    "BatchScore",
    "CacheControl",
    "CachedHashStorage",
    "CachedStorage",
    "DeltaRows",
    "ExportedRows",
    "Footprint",
    "HashTableStorage",
    "HashTier",
    "HostBacking",
    "HybridStorage",
    "RowInit",
    "RowLayout",
    "StepGraphs",
    "StepRows",
    "TableRows",
    "TableStorage",
    "by_memory",
    "cache_layout",
    "create_storage",
    "plan_footprint",
    "table_metadata_bytes",
]

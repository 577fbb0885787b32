"""Storage tiers: where the value rows of dynamic tables live.

The embedding module reaches rows only through ``TableStorage``, built by
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

from dynamicemb.storage.base import ExportedRows, Footprint, RowInit, TableStorage, by_memory
from dynamicemb.storage.cache import CachedStorage
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

__all__ = [
    "CACHE_BUCKET_CAPACITY",
    "BatchScore",
    "CachedStorage",
    "ExportedRows",
    "Footprint",
    "by_memory",
    "HashTableStorage",
    "HybridStorage",
    "RowInit",
    "RowLayout",
    "TableRows",
    "TableStorage",
    "cache_layout",
    "create_storage",
    "plan_footprint",
    "table_metadata_bytes",
]

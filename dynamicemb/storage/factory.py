"""Which storage a module's tables get, and what it allocates.

``create_storage`` builds a module's ``TableStorage`` from its tables'
options; ``plan_footprint`` computes, from one table's options alone, the
bytes that storage allocates for it when it is built (the estimate
``dynamicemb.planner.prepare.dynamic_shard_storage`` reports), by the same
rules.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dynamicemb.dynamicemb_config import (
    BUCKET_ALIGNMENT,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
    value_row_bytes,
)
from dynamicemb.storage.cache import CachedHashStorage, CachedStorage
from dynamicemb.storage.external import ExternalBacking
from dynamicemb.storage.hash_storage import HashTableStorage
from dynamicemb.storage.hybrid import HybridStorage
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.placement import (
    bucket_widths,
    device_rows,
    initial_layout,
    remap_bytes,
)
from dynamicemb.storage.scores import cache_strategies
from dynamicemb.storage.types import Footprint, TableStorage
from dynamicemb.table import state_bytes

# Slots per bucket of a device cache (the spec's "1024 when the table serves
# as cache"); a cache of fewer rows is one bucket.
CACHE_BUCKET_CAPACITY = 1024


def cache_layout(budget: int, row_bytes: int, table: str = "") -> tuple[int, int]:
    """(slots, bucket width) of the device cache a budget of ``budget`` bytes
    holds: ``budget // row_bytes`` rows in buckets of ``CACHE_BUCKET_CAPACITY``
    (or one bucket of a multiple of 16 when fewer).

    Raises:
        ValueError: the budget holds fewer than 16 rows.
    """
    rows = budget // row_bytes
    if rows < BUCKET_ALIGNMENT:
        raise ValueError(
            f"{table}caching=True needs local_hbm_for_values of at least {BUCKET_ALIGNMENT} rows "
            f"({BUCKET_ALIGNMENT * row_bytes} bytes of {row_bytes}-byte rows) for the device "
            f"cache, got {budget}"
        )
    if rows >= CACHE_BUCKET_CAPACITY:
        return rows // CACHE_BUCKET_CAPACITY * CACHE_BUCKET_CAPACITY, CACHE_BUCKET_CAPACITY
    width = rows // BUCKET_ALIGNMENT * BUCKET_ALIGNMENT
    return width, width


def table_metadata_bytes(slots: Sequence[int], num_scores: int, rows: Sequence[int]) -> int:
    """Bytes of a ``ScoredHashTable``'s state (``dynamicemb.table.state_bytes``)
    for tables of ``slots`` slots and ``rows`` NO_EVICTION rows (0 for evicting
    tables)."""
    return state_bytes(slots, num_scores, sum(rows))


def create_storage(
    options: Sequence[DynamicEmbTableOptions],
    layout: RowLayout,
    device: torch.device,
    scorer_factory: Callable | None = None,
) -> TableStorage:
    """The storage of a module's tables (they share ``caching``,
    ``external_storage``, the score strategy and ``evicted_item_mode``).

    * no cache, no external storage: a ``HybridStorage`` (a
      ``HashTableStorage``) whose rows are split between device and host
      memory by ``local_hbm_for_values``;
    * ``caching=True``: a ``CachedStorage`` of a device cache of the budget
      over a host ``HashTableStorage`` (a ``CachedHashStorage``) or the
      external storage;
    * an external storage without cache: a ``CachedStorage`` without cache.

    Raises:
        ValueError: a cache budget below 16 rows (naming the table), or an
            external storage reporting another row format.
        TypeError: an external storage that breaks the ``Storage`` contract.
    """
    first = options[0]
    strategies = first.score_strategies()
    retain = first.evicted_item_mode == EvictedItemMode.RETAIN_KEY
    budgets = [int(o.local_hbm_for_values) for o in options]
    if not first.caching and first.external_storage is None:
        return HybridStorage(
            options, layout, device, budgets, scorer_factory, retain_evicted=retain
        )
    cache = None
    if first.caching:
        shapes = [
            cache_layout(b, rb, f"table {t}: ")
            for t, (b, rb) in enumerate(zip(budgets, layout.row_bytes))
        ]
        cached = cache_strategies(strategies)
        cache = HashTableStorage(
            options,
            layout,
            device,
            budgets=[cap * rb for (cap, _), rb in zip(shapes, layout.row_bytes)],
            scorer_factory=scorer_factory if cached == strategies else None,
            strategies=cached,
            capacities=[cap for cap, _ in shapes],
            bucket_capacities=[w for _, w in shapes],
        )
    kind = CachedStorage
    if first.external_storage is None:
        kind = CachedHashStorage
        backing = HashTableStorage(
            options, layout, device, [0] * len(options), scorer_factory, retain_evicted=retain
        )
    else:
        backing = ExternalBacking(
            first.external_storage,
            layout,
            [int(o.max_capacity) for o in options],
            first.num_scores(),
            device,
        )
    return kind(
        cache,
        backing,
        layout,
        device,
        cache.strategies if cache is not None else strategies,
        strategies,
    )


def plan_footprint(
    options: DynamicEmbTableOptions, dtype: torch.dtype, optimizer: Any
) -> Footprint:
    """What ``create_storage`` allocates for one table, from its options:
    device tier (every hash table's metadata, device rows) and host tier.

    An external storage's own memory is not known before it is built and is
    not counted.

    Args:
        options (DynamicEmbTableOptions): the table's per-rank options
            (``dim`` and ``max_capacity`` set).
        dtype (torch.dtype): the embedding dtype when ``embedding_dtype`` is
            None.
        optimizer: the fused optimizer (None: no state).
    """
    dtype = options.embedding_dtype or dtype
    rb = value_row_bytes(optimizer, int(options.dim), dtype, options.training)
    no_eviction = DynamicEmbScoreStrategy.NO_EVICTION in options.score_strategies()
    ns = options.num_scores()
    slots, rows = initial_layout([options], no_eviction)
    table_meta = table_metadata_bytes(slots, ns, rows if no_eviction else [0])
    budget = int(options.local_hbm_for_values)
    if not options.caching and options.external_storage is None:
        dev = device_rows(rows, [rb], [budget])[0]
        return Footprint(
            device=table_meta + remap_bytes(rows[0], dev) + dev * rb, host=(rows[0] - dev) * rb
        )
    device, host = 0, 0
    if options.caching:
        cap, _ = cache_layout(budget, rb)
        cache_ns = len(cache_strategies(options.score_strategies()))
        device += table_metadata_bytes([cap], cache_ns, [0]) + cap * rb
    if options.external_storage is None:
        device += table_meta
        host += rows[0] * rb
    return Footprint(device=device, host=host)


__all__ = [
    "CACHE_BUCKET_CAPACITY",
    "bucket_widths",
    "cache_layout",
    "create_storage",
    "plan_footprint",
    "table_metadata_bytes",
]

"""The instruments of ``figures.FIGURES`` over the tables of instrumented modules.

Every instrument is observable: nothing is recorded while training runs. When
a metrics collection asks (a Prometheus scrape, a periodic reader's export),
the first instrument called reads every table of every instrumented module
(``MetricsRegistry.read``: one device-to-host copy per device) and the other
instruments of the same collection observe that reading. A training step
does nothing more than without metrics: the counters are kept on the device
by the table kernels and the module anyway.

Modules are held by weak reference: instrumenting a model does not keep it
alive, and a module that is gone is dropped from the next reading.
"""

import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from dynamicemb._seams import provided
from dynamicemb.metrics.figures import (
    COLLECTION,
    COUNTER,
    FIGURES,
    GAUGE,
    METER_NAME,
    RANK,
    TABLE,
    UP_DOWN_COUNTER,
    Figure,
    TableReading,
    observations,
)
from dynamicemb.storage.stats import StatCol
from dynamicemb.storage.table_rows import TableRows
from dynamicemb.table import enums
from dynamicemb.types import MemoryType


@dataclass
class _Source:
    """The rows of one instrumented module and the attributes of its tables."""

    rows: "weakref.ref[TableRows]"
    attributes: list[dict]


class MetricsRegistry:
    """The dynamicemb instruments of one MeterProvider and the tables they read.

    Use ``instrument(model)``, which registers a model's tables with the
    registry of the global MeterProvider (or of the one given).

    Args:
        meter_provider (MeterProvider, optional): where the instruments are
            created; default: OpenTelemetry's global provider (a no-op until
            an SDK is configured).
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None) -> None:
        # The meter's version is the package's (dynamicemb.__version__).
        meter = metrics.get_meter(METER_NAME, provided("version"), meter_provider=meter_provider)
        self._sources: list[_Source] = []
        self._cond = threading.Condition()
        self._generation = 0  # readings taken (read() calls)
        # The instruments' shared reading: its number, and the number each
        # instrument last observed.
        self._readings: list[TableReading] = []
        self._readings_at = -1
        self._used: dict[str, int] = {}
        create = {
            COUNTER: meter.create_observable_counter,
            UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
            GAUGE: meter.create_observable_gauge,
        }
        self.instruments = [
            create[f.kind](f.name, [self._callback(f)], unit=f.unit, description=f.description)
            for f in FIGURES
        ]

    # ----------------------------------------------------------- sources --

    def add(
        self,
        rows: TableRows,
        collection: str,
        table_names: Sequence[str],
        rank: int,
    ) -> None:
        """Registers the tables of one fused module, through its rows object
        (``BatchedDynamicEmbeddingTablesV2.rows``; again: ignored).

        The tables of an external storage publish what dynamicemb knows of
        them (see ``TableReading``): no table counters.
        """
        rows = _module_rows(rows) or rows
        if not isinstance(rows, TableRows):
            raise TypeError(
                f"expected a BatchedDynamicEmbeddingTablesV2, got {type(rows).__name__}"
            )
        names = list(table_names)
        if len(names) != rows.num_tables:
            raise ValueError(
                f"{len(names)} table names for a module of {rows.num_tables} tables: {names}"
            )
        with self._cond:
            if any(s.rows() is rows for s in self._sources):
                return
            attrs = [{COLLECTION: collection, TABLE: name, RANK: int(rank)} for name in names]
            self._sources.append(_Source(weakref.ref(rows), attrs))

    def num_tables(self) -> int:
        """Tables of the live registered modules."""
        with self._cond:
            return sum(len(s.attributes) for s in self._sources if s.rows() is not None)

    # ----------------------------------------------------------- reading --

    def read(self) -> list[TableReading]:
        """Reads every registered table now: the collect hook.

        The device counters of all modules on one device are gathered into one
        tensor and copied to the host once (on CUDA that waits for the work
        queued before it on the current stream of the calling thread).
        """
        with self._cond:
            live = [(s.rows(), s) for s in self._sources]
            self._sources = [s for r, s in live if r is not None]
            live = [(r, s) for r, s in live if r is not None]
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        parts = []
        for rows, _ in live:
            # A relayout replaces `counters` whole: this is the old or the new one.
            # An external storage's tables have no hash table, no counters.
            counters = (rows.counters(),) if rows.has_hash_table else ()
            tensors = (*counters, rows.stats.counts)
            parts.append(tensors)
            by_device.setdefault(rows.device, []).extend(tensors)
        host = {
            dev: torch.cat([t.reshape(-1) for t in ts]).cpu().tolist()
            for dev, ts in by_device.items()
        }
        cols = [c.name for c in enums.CounterCol]
        readings: list[TableReading] = []
        for (rows, source), tensors in zip(live, parts):
            # This module's counter rows, in the order they were concatenated.
            flat = host[rows.device]
            counts = []
            for t in tensors:
                n, width = t.shape
                counts.append([flat[i * width : (i + 1) * width] for i in range(n)])
                del flat[: n * width]
            memory = {mt: rows.memory_per_table(mt) for mt in MemoryType}
            # A cache holds rows its backing table does not (yet): count every tier.
            held = rows.sizes() if rows.storage.has_cache or not rows.has_hash_table else None
            stats = counts[-1]
            for t, attrs in enumerate(source.attributes):
                counters = {}
                if rows.has_hash_table:
                    counters = {c: counts[0][t][int(enums.CounterCol[c])] for c in cols}
                readings.append(
                    TableReading(
                        attributes=attrs,
                        counters=counters,
                        stats={c: stats[t][int(c)] for c in StatCol if c in rows.stats.fed},
                        held=counters["SIZE"] if held is None else held[t],
                        capacity=rows.capacity(t),
                        limit=rows.limit(t),
                        memory={mt: memory[mt][t] for mt in MemoryType},
                    )
                )
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
        return readings

    @property
    def reads(self) -> int:
        """How many readings were taken so far."""
        with self._cond:
            return self._generation

    def wait_for_reads(self, after: int, count: int = 1, timeout: float | None = None) -> bool:
        """Waits until ``count`` readings were taken after ``reads`` was
        ``after``; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._generation < after + count:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _reading_for(self, name: str) -> list[TableReading]:
        """The reading of the current collection for one instrument: a new one
        when this instrument has already observed the latest."""
        with self._cond:
            stale = self._readings_at < 0 or self._used.get(name) == self._readings_at
        if stale:
            readings = self.read()
            with self._cond:
                self._readings, self._readings_at = readings, self._generation
        with self._cond:
            self._used[name] = self._readings_at
            return self._readings

    def _callback(self, figure: Figure):
        def observe(options: CallbackOptions):
            for value, attrs in observations(figure, self._reading_for(figure.name)):
                yield Observation(value, attrs)

        return observe


_REGISTRIES: "weakref.WeakKeyDictionary[object, MetricsRegistry]" = weakref.WeakKeyDictionary()
_GLOBAL: list[MetricsRegistry] = []
_LOCK = threading.Lock()


def registry(meter_provider: metrics.MeterProvider | None = None) -> MetricsRegistry:
    """The registry of a MeterProvider (None: the global one), made on first use."""
    with _LOCK:
        if meter_provider is None:
            if not _GLOBAL:
                _GLOBAL.append(MetricsRegistry())
            return _GLOBAL[0]
        if meter_provider not in _REGISTRIES:
            _REGISTRIES[meter_provider] = MetricsRegistry(meter_provider)
        return _REGISTRIES[meter_provider]


def _default_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _module_rows(module) -> TableRows | None:
    """The rows object of a ``BatchedDynamicEmbeddingTablesV2`` (its
    ``rows``); None for anything else."""
    rows = getattr(module, "rows", None)
    return rows if isinstance(rows, TableRows) else None


def instrument(
    model: torch.nn.Module,
    collection: str | None = None,
    table_names: Sequence[str] | None = None,
    rank: int | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> MetricsRegistry:
    """Publishes the figures of a model's dynamic tables on this rank.

    Args:
        model (torch.nn.Module): a sharded model (DistributedModelParallel or a
            module holding dynamicemb's sharded collections), or one
            ``BatchedDynamicEmbeddingTablesV2``.
        collection (str, optional): the COLLECTION attribute of a
            ``BatchedDynamicEmbeddingTablesV2``; a sharded model's collections
            are named as checkpoints and deltas name them
            (``dynamicemb.shard.tables.collection_name``: ``model.<path>``).
        table_names (Sequence[str], optional): TABLE attributes of a
            ``BatchedDynamicEmbeddingTablesV2`` (default ``table_0``, ...); a
            sharded model's tables have their config names.
        rank (int, optional): the RANK attribute; default: the process
            group's rank, 0 without one.
        meter_provider (MeterProvider, optional): default: the global one.

    Returns:
        MetricsRegistry: the registry now reading the tables.

    Raises:
        ValueError: the model has no dynamic tables.

    Example::

        from dynamicemb.metrics import instrument, serve_prometheus

        endpoint = serve_prometheus(9464 + rank)  # this rank's /metrics
        instrument(model)  # after sharding; the figures are read when Prometheus scrapes
    """
    rank = _default_rank() if rank is None else int(rank)
    reg = registry(meter_provider)
    own = _module_rows(model)
    if own is not None:
        n = own.num_tables
        names = [f"table_{t}" for t in range(n)] if table_names is None else table_names
        reg.add(own, collection or "", names, rank)
        return reg
    from dynamicemb.shard.tables import model_tables

    fused: dict[int, tuple[str, TableRows, dict[int, str]]] = {}
    for collection_, refs in model_tables(model).items():
        for ref in refs.values():
            entry = fused.setdefault(id(ref.rows), (collection_, ref.rows, {}))
            entry[2][ref.index] = ref.name
    if not fused:
        raise ValueError(
            f"{type(model).__name__} holds no dynamic embedding tables (no "
            "BatchedDynamicEmbeddingTablesV2 and no sharded dynamicemb collection)"
        )
    for collection_, rows, names in fused.values():
        reg.add(rows, collection_, [names[t] for t in range(rows.num_tables)], rank)
    return reg

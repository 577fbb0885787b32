"""The figures dynamicemb publishes: one table of OpenTelemetry instruments.

Every figure is per logical table, with the attributes ``COLLECTION``,
``TABLE`` and ``RANK``. Names and units follow OpenTelemetry's semantic
conventions: a ``dynamicemb.`` namespace, counters of countable things
pluralized with a ``{key}`` annotation unit, ``usage`` / ``limit`` for an
amount and its bound (UpDownCounters: they add up over tables and ranks), a
gauge without unit (``1``) for a ratio, bytes as ``By``.

A figure reads a ``TableReading``: one table's values from one collection
(``MetricsRegistry.read``), where the counters are read from the device.

In Prometheus a figure is named by OpenTelemetry's rules for it
(``prometheus_name``): dots become underscores, the unit is a suffix
(``_bytes`` for ``By``; ``_ratio`` for ``1``, which the Prometheus exporter
leaves out, so ``serve_prometheus`` adds it with a view: ``prometheus_views``;
an annotation such as ``{key}`` adds nothing) and a counter ends in
``_total``.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dynamicemb.storage.stats import StatCol
from dynamicemb.types import MemoryType

METER_NAME = "dynamicemb"

# Attributes of every observation.
COLLECTION = "dynamicemb.collection.name"
TABLE = "dynamicemb.table.name"
RANK = "dynamicemb.rank"
# Attribute of the memory figure: a MemoryType value ("device", "host").
MEMORY_TYPE = "dynamicemb.memory.type"

# Instrument kinds (all observable: values are read when a collection asks).
COUNTER = "counter"
UP_DOWN_COUNTER = "up_down_counter"
GAUGE = "gauge"


@dataclass(frozen=True)
class TableReading:
    """One table's values, read in one collection.

    Attributes:
        attributes (dict): COLLECTION, TABLE and RANK.
        counters (dict[str, int]): the table's device counters by
            ``CounterCol`` name (``SIZE``, ``INSERTS``, ``EVICTIONS``,
            ``INSERT_FAILURES``, ...); empty for a table whose rows live in
            an external storage (no dynamicemb hash table counts them).
        stats (dict[StatCol, int]): the module's counters, only those it feeds.
        held (int): rows held, in every tier: a cached table's rows in its
            device cache that its backing table does not hold count too.
        capacity (int): slots of the table's key map now (an external
            storage: its ``capacity``).
        limit (int): rows it can hold now (NO_EVICTION: its value rows; else
            its slots; an external storage: its ``capacity``).
        memory (dict[MemoryType, int]): bytes of each memory type it holds.
    """

    attributes: dict
    counters: dict[str, int]
    stats: dict[StatCol, int]
    held: int
    capacity: int
    limit: int
    memory: dict[MemoryType, int]


Observations = list[tuple[float, dict]]


@dataclass(frozen=True)
class Figure:
    """One instrument.

    Attributes:
        name (str): OpenTelemetry instrument name.
        kind (str): COUNTER, UP_DOWN_COUNTER or GAUGE.
        unit (str): UCUM unit, ``{...}`` for an annotated count.
        description (str): what it counts.
        read (Callable[[TableReading], Observations]): its observations of one
            table: (value, extra attributes) pairs; none where the table's
            module does not count it.
        needs (str): what a module must have for the figure to be reported
            (``"admission"``, ``"cache"``), or ``""``: a dashboard panel of it
            reads "no <needs>" for a job without.
    """

    name: str
    kind: str
    unit: str
    description: str
    read: Callable[[TableReading], Observations]
    needs: str = ""


def _counter(col: str) -> Callable[[TableReading], Observations]:
    return lambda r: [(r.counters[col], {})] if col in r.counters else []


def _stat(col: StatCol) -> Callable[[TableReading], Observations]:
    return lambda r: [(r.stats[col], {})] if col in r.stats else []


def _memory(r: TableReading) -> Observations:
    return [(b, {MEMORY_TYPE: t.value}) for t, b in r.memory.items()]


FIGURES: tuple[Figure, ...] = (
    Figure(
        "dynamicemb.table.lookups",
        COUNTER,
        "{key}",
        "Distinct keys of each batch looked up in the table (training and eval).",
        _stat(StatCol.LOOKUPS),
    ),
    Figure(
        "dynamicemb.table.inserts",
        COUNTER,
        "{key}",
        "New keys placed in the table.",
        _counter("INSERTS"),
    ),
    Figure(
        "dynamicemb.table.evictions",
        COUNTER,
        "{key}",
        "Resident keys evicted to make room for new ones.",
        _counter("EVICTIONS"),
    ),
    Figure(
        "dynamicemb.table.insert_failures",
        COUNTER,
        "{key}",
        "Keys that could not be placed (their bucket held only keys of the same batch).",
        _counter("INSERT_FAILURES"),
    ),
    Figure(
        "dynamicemb.table.admissions",
        COUNTER,
        "{key}",
        "Missing keys admission let into the table.",
        _stat(StatCol.ADMISSIONS),
        needs="admission",
    ),
    Figure(
        "dynamicemb.table.rejections",
        COUNTER,
        "{key}",
        "Missing keys admission turned away.",
        _stat(StatCol.REJECTIONS),
        needs="admission",
    ),
    Figure(
        "dynamicemb.table.refusals",
        COUNTER,
        "{key}",
        "New keys not inserted: colder than their full bucket's lowest (refuse_cold_keys).",
        _stat(StatCol.REFUSALS),
    ),
    Figure(
        "dynamicemb.cache.hits",
        COUNTER,
        "{key}",
        "Distinct keys found in the cache tier.",
        _stat(StatCol.CACHE_HITS),
        needs="cache",
    ),
    Figure(
        "dynamicemb.cache.misses",
        COUNTER,
        "{key}",
        "Distinct keys the cache tier did not hold.",
        _stat(StatCol.CACHE_MISSES),
        needs="cache",
    ),
    Figure(
        "dynamicemb.table.usage",
        UP_DOWN_COUNTER,
        "{row}",
        "Rows held: keys stored in the table, in any tier (a cached table's cache too).",
        lambda r: [(r.held, {})],
    ),
    Figure(
        "dynamicemb.table.limit",
        UP_DOWN_COUNTER,
        "{row}",
        "Rows the table can hold at its current capacity.",
        lambda r: [(r.limit, {})],
    ),
    Figure(
        "dynamicemb.table.load_factor",
        GAUGE,
        "1",
        "Keys stored over the slots of the table's key map.",
        lambda r: [(r.counters["SIZE"] / r.capacity, {})] if "SIZE" in r.counters else [],
    ),
    Figure(
        "dynamicemb.memory.usage",
        UP_DOWN_COUNTER,
        "By",
        "Bytes the table's slots and value rows take, by memory type.",
        _memory,
    ),
)


# Prometheus suffixes of the units the figures use (OpenTelemetry's
# compatibility rules for Prometheus; an annotation unit like {key} has none).
UNIT_SUFFIXES = {"By": "_bytes", "1": "_ratio"}


def prometheus_name(figure: Figure) -> str:
    """The name of a figure's samples in Prometheus."""
    name = figure.name.replace(".", "_") + UNIT_SUFFIXES.get(figure.unit, "")
    return name + "_total" if figure.kind == COUNTER else name


def observations(figure: Figure, readings: Iterable[TableReading]) -> Observations:
    """The figure's (value, attributes) pairs over the readings."""
    return [(value, {**r.attributes, **extra}) for r in readings for value, extra in figure.read(r)]

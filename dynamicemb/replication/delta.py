"""The delta of an incremental dump: ``DeltaDumpResult``, its sequence
numbers and checksums.

A ``DeltaDumpResult`` holds one embedding collection's changed rows, table by
table (column-aligned lists). Beyond the fields the API names, every table's
``meta`` carries

* ``"sequence"``: the table's delta number (1 for its first incremental dump,
  then one more per dump; a checkpoint records the last one). A replay
  records it; a stream follower (``stream.py``) applies only the delta that
  follows the last one it applied, so a lost delta (a gap) or one applied
  twice (a duplicate) is refused there. ``replay_increment`` itself applies
  any delta, in any order;
* ``"run"``, ``"epoch"``, ``"rank"``: where the delta comes from. ``run`` is
  an id drawn at the table's first dump (with a process group, rank 0's) and
  kept by its checkpoints; ``epoch`` counts the restarts of that run a
  stream went through (``stream.py``; 0 outside a stream); ``rank`` is the
  producing rank of a per-rank delta (``pg=None`` on a sharded table), None
  when the delta holds every rank's keys. A replay records a delta's
  sequence and source only where the delta is this rank's (``rank`` None or
  this rank): another rank's delta applies (its keys are skipped) but does
  not advance this rank's chain;
* ``"checksum"``: the CRC-32 (zlib's, as the checkpoint files use) of the
  table's columns and of the meta entries a replay reads, so a delta changed
  anywhere after the dump (in memory, in transit, on disk) is refused. Both
  are optional for a replay: a delta built by hand, or edited on purpose
  (keys filtered), leaves its checksum out or recomputes it
  (``delta_checksum(delta.table(i))``).
"""

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamicemb._checks import is_int
from dynamicemb.dynamicemb_config import DynamicEmbScoreStrategy
from dynamicemb.io.dtypes import dtype_name
from dynamicemb.table import check_keys, first_repeat

__all__ = [
    "TENSOR_COLUMNS",
    "DeltaDumpResult",
    "DeltaError",
    "check_delta_checksum",
    "check_delta_intact",
    "check_delta_keys",
    "check_delta_meta",
    "check_delta_rows",
    "check_delta_values",
    "delta_checksum",
    "delta_column",
    "meta_description",
    "options_description",
]


# The per-table tensor columns of a delta (besides meta's slot_index).
TENSOR_COLUMNS = (
    "keys",
    "values",
    "optimizer_states",
    "scores",
    "erased_keys",
    "evicted_keys",
)


class DeltaError(ValueError):
    """A delta that must not be replayed: corrupted (its checksum does not
    match), or in a stream out of sequence (a gap, a duplicate) or of
    another run. Replaying it changed nothing."""


@dataclass
class DeltaDumpResult:
    """The incremental dump of one embedding collection.

    The lists are column-aligned: element ``i`` of each refers to
    ``table_names[i]``.

    Attributes:
        table_names (List[str]): the dumped tables.
        keys (List[torch.Tensor]): per table, (N) int64 keys on the host:
            the keys whose score crossed the threshold.
        values (List[torch.Tensor]): per table, (N, dim) embeddings on the
            host. Embeddings only: the rest of a stored row is in
            ``optimizer_states``; the two side by side are the row as the
            table holds it.
        optimizer_states (List[Optional[torch.Tensor]]): per table, (N,
            state_dim) optimizer state on the host, at the width checkpoints
            use; None when the table keeps none (plain SGD, or a table built
            for evaluation).
        scores (List[torch.Tensor]): per table, (N, num_scores) int64 score
            words in ``score_strategy`` order. A timestamp column holds an
            age (``meta[i]["current_score"] - timestamp``): clocks are per
            device, and a replay rebases ages onto its own. Other columns
            (LFU, STEP, CUSTOMIZED, the NO_EVICTION row) are verbatim.
        erased_keys (List[Optional[torch.Tensor]]): per table, (M) int64 keys
            an erase recorded (``erase_keys`` with ``RETAIN_KEY``) since the
            previous dump and not back in the table by this one; always a
            tensor here, possibly empty (a replay reads None as empty).
            Replays remove them.
        evicted_keys (List[Optional[torch.Tensor]]): per table, (M) int64 keys
            evicted since the previous dump and not back in the table by
            this one, for tables with ``evicted_item_mode=RETAIN_KEY``; None
            for the others. Dumping drains the table's record of them.
            ``replay_increment`` never applies them (the key that took an
            evicted key's slot overwrites it); a replay by key removes them.
        meta (List[Dict[str, Any]]): per table: ``current_score`` (int, the
            table's score at the dump: the next threshold), ``slot_index``
            ((N) int64, each key's slot in its table), ``current_capacity``
            (key-map slots), ``row_capacity`` (tuple of value rows per storage
            tier), ``bucket_capacity``, ``num_scores``, ``world_size`` (ranks
            the table is sharded over), ``table_options``
            (``DynamicEmbTableOptions``), and ``sequence``, ``run``,
            ``epoch``, ``rank`` and ``checksum`` (see the module docstring).
    """

    table_names: list[str] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    optimizer_states: list[torch.Tensor | None] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)
    erased_keys: list[torch.Tensor | None] = field(default_factory=list)
    evicted_keys: list[torch.Tensor | None] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)

    COLUMNS = ("table_names",) + TENSOR_COLUMNS + ("meta",)

    def __len__(self) -> int:
        return len(self.table_names)

    def table(self, i: int) -> dict[str, Any]:
        """Table ``i``'s entries, by column name (``meta`` included)."""
        return {c: getattr(self, c)[i] for c in self.COLUMNS}

    def append(self, entry: dict[str, Any]) -> None:
        for c in self.COLUMNS:
            getattr(self, c).append(entry[c])


def options_description(o) -> dict[str, Any]:
    """The fields of a table's ``DynamicEmbTableOptions`` a delta records, as
    plain JSON values (``stream.options_from`` builds options back)."""
    return {
        "dim": o.dim,
        "score_strategy": [s.name for s in o.score_strategies()],
        "dist_type": o.dist_type,
        "bucket_capacity": o.bucket_capacity,
        "max_capacity": o.max_capacity,
        "evicted_item_mode": o.evicted_item_mode.name,
        "training": o.training,
        "embedding_dtype": None if o.embedding_dtype is None else dtype_name(o.embedding_dtype),
    }


def meta_description(meta: dict[str, Any]) -> dict[str, Any]:
    """The meta entries a replay reads, as plain JSON values (no tensors, the
    table options as ``options_description``)."""
    opts = meta.get("table_options")
    return {
        "current_score": meta.get("current_score"),
        "current_capacity": meta.get("current_capacity"),
        "row_capacity": list(meta.get("row_capacity") or ()),
        "bucket_capacity": meta.get("bucket_capacity"),
        "num_scores": meta.get("num_scores"),
        "world_size": meta.get("world_size"),
        "sequence": meta.get("sequence"),
        "run": meta.get("run"),
        "epoch": meta.get("epoch"),
        "rank": meta.get("rank"),
        "table_options": None if opts is None else options_description(opts),
    }


def _crc_tensor(crc: int, t: torch.Tensor | None) -> int:
    """Folds a tensor's dtype, shape and bytes into ``crc`` (None: a marker)."""
    if t is None:
        return zlib.crc32(b"none", crc)
    t = t.detach().contiguous().cpu()
    crc = zlib.crc32(f"{t.dtype}{tuple(t.shape)}".encode(), crc)
    return zlib.crc32(memoryview(t.reshape(-1).view(torch.uint8).numpy()), crc)


def delta_checksum(entry: dict[str, Any]) -> int:
    """CRC-32 of one table's entry of a delta (``DeltaDumpResult.table``):
    its name, every column and the meta a replay reads; ``meta["checksum"]``
    itself is left out."""
    meta = entry["meta"]
    desc = json.dumps(meta_description(meta), sort_keys=True, separators=(",", ":"))
    crc = zlib.crc32(f"{entry['table_names']}\0{desc}".encode())
    for c in TENSOR_COLUMNS:
        crc = _crc_tensor(crc, entry[c])
    return _crc_tensor(crc, meta.get("slot_index"))


# ------------------------------------------- checks every replay makes --
# ``what`` opens each message (``replay: table 't0' of 'model.sparse.ebc'``).


def delta_column(
    entry: dict[str, Any],
    column: str,
    ndim: int,
    what: str,
    dtype: torch.dtype | None = None,
    rows: int | None = None,
    optional: bool = False,
) -> torch.Tensor | None:
    """A column of a table's delta, checked: an ``ndim``-D tensor (of
    ``dtype``, with ``rows`` rows, where given; None where ``optional``).

    Raises:
        ValueError: naming the column and what it is instead.
    """
    t = entry[column]
    if t is None and optional:
        return None
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        raise ValueError(
            f"{what}: the delta's {column} is not a {ndim}-D tensor ({type(t).__name__})"
        )
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{what}: the delta's {column} are {t.dtype}, not {dtype}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{what}: the delta's {column} has {t.shape[0]} rows for {rows} keys")
    return t


def check_delta_meta(entry: dict[str, Any], what: str) -> dict[str, Any]:
    """A table's delta's meta, checked for what every replay reads: a dict
    with an int ``num_scores``, int ``sequence`` and ``checksum`` where
    present (a delta built by hand has neither) and ``table_options``.

    Raises:
        ValueError: naming the entry that is missing or wrong.
    """
    meta = entry["meta"]
    if not isinstance(meta, dict):
        raise ValueError(f"{what}: the delta has no meta dict")
    if not is_int(meta.get("num_scores")):
        raise ValueError(f"{what}: the delta's meta has no int 'num_scores'")
    for name in ("sequence", "checksum"):
        if meta.get(name) is not None and not is_int(meta[name]):
            raise ValueError(f"{what}: the delta's meta {name!r} is {meta[name]!r}, not an int")
    if meta.get("table_options") is None:
        raise ValueError(f"{what}: the delta's meta has no table_options")
    return meta


def check_delta_checksum(entry: dict[str, Any], what: str) -> None:
    """Refuses a table's delta whose checksum (where it has one) does not
    match its contents.

    Raises:
        DeltaError: the delta is corrupted.
    """
    meta = entry["meta"]
    if meta.get("checksum") is not None and delta_checksum(entry) != meta["checksum"]:
        raise DeltaError(
            f"{what}: delta {meta.get('sequence')} is corrupted: its checksum "
            f"{meta['checksum']} does not match its contents ({delta_checksum(entry)}); a delta "
            "edited on purpose (keys filtered) drops meta['checksum'] or sets it to "
            "delta_checksum(delta.table(i))"
        )


def check_delta_values(entry: dict[str, Any], rows: int, dim: int, what: str) -> torch.Tensor:
    """A table's delta's values, checked: (``rows``, ``dim``) floating point.

    Raises:
        ValueError: values of another shape or dtype (naming both).
    """
    values = delta_column(entry, "values", 2, what, rows=rows)
    if values.shape[1] != dim or not values.is_floating_point():
        raise ValueError(
            f"{what}: the delta's values are {values.dtype} {tuple(values.shape)}, not (N, "
            f"{dim}) floating point"
        )
    return values


def check_delta_keys(keys: torch.Tensor, what: str) -> None:
    """Refuses a reserved key, or one held twice, among a delta's keys
    written by key.

    Raises:
        ValueError: naming the key (reserved) or saying a key repeats.
    """
    check_keys(keys, f"{what}: the delta's keys")
    if first_repeat(keys) is not None:
        raise ValueError(f"{what}: the delta holds a key twice")


def check_delta_intact(entry: dict[str, Any], what: str) -> torch.Tensor:
    """A table's delta's keys, (N) int64, with the delta checked against its
    checksum where it has one: what every replay reads first.

    Raises:
        DeltaError: the delta is corrupted.
        ValueError: keys that are not an int64 vector.
    """
    keys = delta_column(entry, "keys", 1, what, torch.int64)
    check_delta_checksum(entry, what)
    return keys


def check_delta_rows(
    entry: dict[str, Any], keys: torch.Tensor, dim: int, what: str, by_key: str | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A table's delta's rows for its ``keys`` (``check_delta_intact``),
    checked as every replay reads them: (N, ``dim``) floating-point values,
    and the erased and evicted keys where present. A delta written by key
    (``by_key`` names the reader) needs the keys its source evicted unless
    the source is NO_EVICTION (a reader by key cannot see an eviction
    happen), and no reserved or repeated key.

    Returns:
        (values, erased_keys, evicted_keys), None where absent.

    Raises:
        ValueError: a malformed column (named), missing evicted keys, a
            reserved or repeated key.
    """
    values = check_delta_values(entry, keys.numel(), dim, what)
    erased, evicted = (
        delta_column(entry, c, 1, what, torch.int64, optional=True)
        for c in ("erased_keys", "evicted_keys")
    )
    if by_key is not None:
        strategies = entry["meta"]["table_options"].score_strategies()
        if evicted is None and DynamicEmbScoreStrategy.NO_EVICTION not in strategies:
            raise ValueError(
                f"{what}: the delta has no evicted_keys: its source does not retain evictions, "
                f"so {by_key} cannot remove what it evicted (set evicted_item_mode=RETAIN_KEY "
                "on the source table)"
            )
        check_delta_keys(keys, what)
    return values, erased, evicted

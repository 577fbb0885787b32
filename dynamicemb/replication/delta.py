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

from dynamicemb.io.dtypes import dtype_name

__all__ = [
    "TENSOR_COLUMNS",
    "DeltaDumpResult",
    "DeltaError",
    "delta_checksum",
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

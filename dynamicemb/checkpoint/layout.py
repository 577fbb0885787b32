"""The checkpoint format: file names, the manifest, the per-table meta JSON.

A checkpoint is a folder::

    <path>/
      dynamicemb_checkpoint.json                  the manifest, written last
      <collection>/                               e.g. model.sparse.ebc
        <table>_meta.json                         per-table meta (below)
        <table>_keys.rank_<r>.world_size_<W>      int64 keys
        <table>_values.rank_<r>.world_size_<W>    (n, embedding_dim) at embedding_dtype (*)
        <table>_opt_values.rank_<r>.world_size_<W>  (n, optim_state_dim) at optim_state_dtype
        <table>_scores.rank_<r>.world_size_<W>    (n, num_scores) int64, score_strategy order
        <table>_counter_keys.rank_<r>.world_size_<W>    (c) admission counter keys
        <table>_counter_values.rank_<r>.world_size_<W>  (c) int64, their counts

(*) For FP8 (``float8_e4m3fn``) a value row is the table's stored row: the
``embedding_dim`` e4m3fn codes, zeros to 4 bytes, the row's float32 scale
(``dynamicemb.io.embeddings``).

``<collection>`` is the collection's name, its module path in the model, the
model itself being ``model`` (``model.sparse.ebc``;
``dynamicemb.shard.tables.collection_name``). Every rank ``r`` of the
dumping world writes the rows it holds; rows are little-endian, row-major,
without headers. The meta JSON of a table records what the files hold
(``embedding_dtype``, ``embedding_dim``, ``optim_state_dtype``,
``optim_state_dim``, the score strategy, the optimizer, its step, the
routing) and, for every rank's shard, its row count and for every file its
size and CRC-32 checksums (one per ``checksum_block_bytes`` block, zlib's
CRC-32). The manifest lists the collections and tables with the size and
checksum of each meta JSON, and carries a checksum of its own body.

The two counter files are there when the table has a frequency counter
(its admitter's ``state()``): the keys waiting to be admitted that rank ``r``
counted, at the counter's key dtype, and their counts, written by the
counter's ``Counter.dump``. Their number ``c`` is not a shard's ``rows`` but
follows from the files' sizes. The meta JSON's ``admission_counter``
describes the counter (None: no counter files): its class, ``key_dtype``,
``count_dtype`` (int64), the entries over all ranks, and the strategy's
threshold and the table's counter share (``capacity``, ``bucket_capacity``)
where the strategy has them.

The legacy layout (written before the meta JSON existed) is one file per kind
and table, ``<table>_keys`` / ``<table>_values`` / ``<table>_scores``
(uint64), float32 values whose row width follows from the file size, and no
checksums; it is read, never written.
"""

import json
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb.io import dtypes, embeddings
from dynamicemb.io.files import CHECKSUM_ALGORITHM, CHECKSUM_BLOCK_BYTES, DataError, FileInfo

FORMAT_NAME = "dynamicemb-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "dynamicemb_checkpoint.json"

# File kinds: (element dtype or None for the table's, columns key in meta).
KEYS, VALUES, OPT_VALUES, SCORES = "keys", "values", "opt_values", "scores"
# Admission counter files: the counted keys, and their counts.
COUNTER_KEYS, COUNTER_VALUES = "counter_keys", "counter_values"
COUNTER_KINDS = (COUNTER_KEYS, COUNTER_VALUES)


class CheckpointError(DataError):
    """A checkpoint that cannot be loaded: missing, incomplete, corrupted, or
    not matching the model. Loading it changed nothing."""


def dtype_of(name: str, what: str) -> torch.dtype:
    return dtypes.dtype_of(name, what, CheckpointError)


def key_dtype_of(name: str, what: str) -> torch.dtype:
    return dtypes.key_dtype_of(name, what, CheckpointError)


def shard_file(table: str, kind: str, rank: int, world_size: int) -> str:
    return f"{table}_{kind}.rank_{rank}.world_size_{world_size}"


def meta_file(table: str) -> str:
    return f"{table}_meta.json"


def legacy_file(table: str, kind: str) -> str:
    return f"{table}_{kind}"


def legacy_args_file(table: str) -> str:
    return f"{table}_opt_args.json"


@dataclass
class Shard:
    """The rows one rank of the dumping world wrote for one table."""

    rank: int
    rows: int
    files: dict[str, FileInfo]

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "rows": self.rows,
            "files": {k: f.to_json() for k, f in sorted(self.files.items())},
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Shard":
        return Shard(
            int(d["rank"]),
            int(d["rows"]),
            {k: FileInfo.from_json(f) for k, f in d["files"].items()},
        )

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.files.values())


@dataclass
class TableMeta:
    """The per-table meta JSON.

    ``optim_state_dim`` is 0 (and ``optim_state_dtype`` None) when the
    checkpoint holds no optimizer state; ``score_strategy`` lists the score
    columns of the scores file (empty: no scores file, NO_EVICTION).
    ``legacy`` marks a table read from the legacy layout (never written).
    ``admission_counter`` describes the table's admission counter, whose
    keys and counts every shard has in its counter files (None: no counter).
    ``delta_sequence`` is the sequence number of the last incremental dump
    the table's rows reflect (dynamicemb.replication); None in checkpoints
    written before it was recorded. ``delta_source`` is the run that numbered
    those deltas (``TableRows.delta_source``: run id, epoch, lineage), None
    before the table's first delta.
    """

    table_name: str
    embedding_dtype: torch.dtype
    embedding_dim: int
    optim_state_dtype: torch.dtype | None
    optim_state_dim: int
    optimizer: str | None
    score_strategy: list[str]
    step: int
    dist_type: str
    num_embeddings: int
    world_size: int
    shards: list[Shard]
    checksum_block_bytes: int = CHECKSUM_BLOCK_BYTES
    admission_counter: dict[str, Any] | None = None
    legacy: bool = False
    delta_sequence: int | None = None
    delta_source: dict[str, Any] | None = None

    @property
    def num_scores(self) -> int:
        return len(self.score_strategy)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def columns(self, kind: str) -> tuple[torch.dtype, int]:
        """(dtype, columns) of a file kind."""
        if kind == KEYS:
            return torch.int64, 1
        if kind == VALUES:
            return embeddings.columns(self.embedding_dtype, self.embedding_dim)
        if kind == OPT_VALUES:
            assert self.optim_state_dtype is not None
            return self.optim_state_dtype, self.optim_state_dim
        if kind == SCORES:
            return torch.int64, self.num_scores
        raise CheckpointError(f"table {self.table_name!r}: unknown file kind {kind!r}")

    def counter_kinds(self) -> list[str]:
        """The counter file kinds every shard has (none without a counter)."""
        return list(COUNTER_KINDS) if self.admission_counter is not None else []

    def counter_key_dtype(self) -> torch.dtype:
        assert self.admission_counter is not None
        return key_dtype_of(
            self.admission_counter.get("key_dtype"), f"table {self.table_name!r} counter"
        )

    def kinds(self) -> list[str]:
        kinds = [KEYS, VALUES]
        if self.optim_state_dim:
            kinds.append(OPT_VALUES)
        if self.num_scores:
            kinds.append(SCORES)
        return kinds

    def encode(self) -> bytes:
        body = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "table_name": self.table_name,
            "embedding_dtype": dtypes.dtype_name(self.embedding_dtype),
            "embedding_dim": self.embedding_dim,
            "optim_state_dtype": (
                None
                if self.optim_state_dtype is None
                else dtypes.dtype_name(self.optim_state_dtype)
            ),
            "optim_state_dim": self.optim_state_dim,
            "optimizer": self.optimizer,
            "score_strategy": self.score_strategy,
            "step": self.step,
            "dist_type": self.dist_type,
            "num_embeddings": self.num_embeddings,
            "world_size": self.world_size,
            "checksum_algorithm": CHECKSUM_ALGORITHM,
            "checksum_block_bytes": self.checksum_block_bytes,
            "admission_counter": self.admission_counter,
            "delta_sequence": self.delta_sequence,
            "delta_source": self.delta_source,
            "shards": [s.to_json() for s in self.shards],
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes, where: str) -> "TableMeta":
        try:
            d = json.loads(data)
            if d.get("checksum_algorithm") != CHECKSUM_ALGORITHM:
                raise CheckpointError(
                    f"{where}: checksum algorithm {d.get('checksum_algorithm')!r} is not "
                    f"{CHECKSUM_ALGORITHM!r}"
                )
            osd = d["optim_state_dtype"]
            meta = TableMeta(
                table_name=str(d["table_name"]),
                embedding_dtype=dtype_of(d["embedding_dtype"], f"{where} embedding_dtype"),
                embedding_dim=int(d["embedding_dim"]),
                optim_state_dtype=None if osd is None else dtype_of(osd, f"{where} optim"),
                optim_state_dim=int(d["optim_state_dim"]),
                optimizer=d["optimizer"],
                score_strategy=[str(s) for s in d["score_strategy"]],
                step=int(d["step"]),
                dist_type=str(d["dist_type"]),
                num_embeddings=int(d["num_embeddings"]),
                world_size=int(d["world_size"]),
                shards=[Shard.from_json(s) for s in d["shards"]],
                checksum_block_bytes=int(d["checksum_block_bytes"]),
                admission_counter=d.get("admission_counter"),
                delta_sequence=(
                    None if d.get("delta_sequence") is None else int(d["delta_sequence"])
                ),
                delta_source=d.get("delta_source"),
            )
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{where}: table meta is not valid ({e!r})") from None
        if meta.admission_counter is not None:
            if not isinstance(meta.admission_counter, dict):
                raise CheckpointError(f"{where}: admission_counter is not an object")
            meta.counter_key_dtype()
        for s in meta.shards:
            missing = set(meta.kinds() + meta.counter_kinds()) - set(s.files)
            if missing:
                raise CheckpointError(
                    f"{where}: shard of rank {s.rank} lists no {sorted(missing)} file"
                )
        return meta

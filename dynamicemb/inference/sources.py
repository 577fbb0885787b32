"""Where an inference table's rows come from: a ``DynamicEmbDump``
checkpoint, read through the checkpoint package's verified readers (the
shards of every dumping rank, at any world size), and the deltas of a
stream, checked as every replay checks them (``dynamicemb.replication.
delta``). Nothing here imports a model's code.
"""

import os
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb.checkpoint.files import resolve
from dynamicemb.checkpoint.layout import KEYS, VALUES, CheckpointError, TableMeta
from dynamicemb.checkpoint.read import (
    check_shard_sizes,
    check_table_keys,
    read_shard,
    table_meta,
)
from dynamicemb.inference.formats import RowFormat
from dynamicemb.replication.delta import (
    DeltaError,
    check_delta_intact,
    check_delta_meta,
    check_delta_rows,
)
from dynamicemb.replication.follow import chain_error

__all__ = [
    "Checkpoint",
    "TableDelta",
    "check_table_delta",
    "collection_of",
    "checked_meta",
    "read_rows",
]

_KINDS = [KEYS, VALUES]


@dataclass
class Checkpoint:
    """A checkpoint folder: where it is read from and its verified
    manifest."""

    path: str
    root: str
    manifest: dict[str, Any]

    @staticmethod
    def open(path: "str | Checkpoint") -> "Checkpoint":
        """The checkpoint at ``path`` (its newest complete version), opened
        here unless it is an opened ``Checkpoint`` already.

        Raises:
            CheckpointError: no checkpoint there, a damaged manifest, or a
                folder of the legacy layout (no manifest).
        """
        if isinstance(path, Checkpoint):
            return path
        root, manifest = resolve(path)
        if manifest is None:
            raise CheckpointError(
                f"{path} holds no dynamicemb checkpoint manifest: an inference table reads the "
                "checkpoints DynamicEmbDump writes (load a legacy one into a model and dump it)"
            )
        return Checkpoint(path, root, manifest)

    def tables(self) -> list[tuple[str, str]]:
        """(collection, table) of every table, in the manifest's order."""
        return [(c, t) for c, ts in self.manifest["collections"].items() for t in ts]

    def meta(self, collection: str, table: str) -> tuple[str, TableMeta]:
        """The folder of a table's files and its checked meta JSON."""
        what = f"table {table!r} of {collection!r}"
        return table_meta(self.root, self.manifest, collection, table, what)


def collection_of(names: list[tuple[str, str]], table: str, collection: str | None, where: str):
    """The collection of ``table`` among (collection, table) pairs:
    ``collection`` if given, else the only one that has the table.

    Raises:
        ValueError: no collection, or several, have the table (naming them).
    """
    have = [c for c, t in names if t == table and (collection is None or c == collection)]
    if len(have) == 1:
        return have[0]
    if not have:
        known = sorted({c for c, t in names if t == table})
        raise ValueError(
            f"{where} has no table {table!r}"
            + (f" in {collection!r}" if collection is not None else "")
            + (f" (it is in {known})" if known else "")
        )
    raise ValueError(
        f"{where} has a table {table!r} in several collections {sorted(have)}: name the "
        "collection in its InferenceTableConfig"
    )


def checked_meta(ckpt: Checkpoint, collection: str, table: str, dim: int) -> tuple[str, TableMeta]:
    """A table's folder and meta, checked against ``dim`` and its files'
    sizes (before anything is read).

    Raises:
        CheckpointError: a file of another size than its meta records, or
            missing.
        ValueError: the checkpoint's dim is not ``dim``.
    """
    folder, meta = ckpt.meta(collection, table)
    what = f"table {table!r} of {collection!r}"
    if meta.embedding_dim != dim:
        raise ValueError(
            f"{what}: the checkpoint's embedding_dim {meta.embedding_dim} differs from the "
            f"inference table's dim {dim}"
        )
    check_shard_sizes(folder, meta, _KINDS, what)
    return folder, meta


def read_rows(
    ckpt: Checkpoint,
    collection: str,
    folder: str,
    meta: TableMeta,
    fmt: RowFormat,
    out: torch.Tensor,
) -> torch.Tensor:
    """Reads a table's rows from every shard of the checkpoint (each file's
    blocks verified) into ``out`` ((meta.rows, width): its rows encoded in
    ``fmt``, in file order); returns their keys, on ``out``'s device.

    Raises:
        CheckpointError: a missing, truncated or corrupted file; a reserved
            or repeated key.
        ValueError: a row ``fmt`` cannot store (naming the key).
    """
    table = meta.table_name
    what = f"table {table!r} of {collection!r}"
    keys, at = [], 0
    for shard in meta.shards:
        part = read_shard(folder, meta, shard, _KINDS, what)
        k = part[KEYS].reshape(-1)
        v = part[VALUES].float()
        bad = fmt.unstorable(v)
        if bool(bad.any()):
            key = int(k[bad.nonzero()[0, 0]])
            raise ValueError(
                f"{what}: the row of key {key} cannot be stored as {fmt.name} "
                "(not finite, or beyond its range)"
            )
        keys.append(k.to(out.device))
        out[at : at + k.numel()] = fmt.encode(v.to(out.device))
        at += k.numel()
    keys = torch.cat(keys) if keys else torch.empty(0, dtype=torch.int64, device=out.device)
    check_table_keys(keys, os.path.join(ckpt.path, collection, table))
    return keys


@dataclass
class TableDelta:
    """What one delta does to one table: the keys it writes with their
    float32 rows, and the keys it removes (erased or evicted, not written
    again); the collection that holds the table in the delta."""

    keys: torch.Tensor
    rows: torch.Tensor
    removed: torch.Tensor
    meta: dict[str, Any]
    collection: str = ""


def check_table_delta(
    entry: dict[str, Any],
    dim: int,
    position: tuple[dict[str, Any] | None, int | None],
    switch_from: int | None,
    what: str,
) -> TableDelta:
    """One table's entry of a delta (``DeltaDumpResult.table``), checked as
    a replay by key checks it and against the table's ``position`` (its
    chain: ``chain_error``); changes nothing.

    Raises:
        DeltaError: a corrupted delta, one of one rank only, another run's,
            or one that does not follow the table's position.
        ValueError: a delta of another dim, or malformed (naming the field).
    """
    meta = check_delta_meta(entry, what)
    theirs = meta["table_options"].dim
    if theirs != dim:
        raise ValueError(
            f"{what}: the delta's table has dim {theirs}, the inference table's is {dim}"
        )
    keys = check_delta_intact(entry, what)
    values, *removals = check_delta_rows(entry, keys, dim, what, by_key="an inference table")
    if meta.get("rank") is not None:
        raise DeltaError(
            f"{what}: delta {meta.get('sequence')} holds the keys of rank {meta['rank']} only; an "
            "inference table applies deltas of every rank (incremental_dump with the process "
            "group, as DeltaPublisher writes them)"
        )
    if meta.get("sequence") is not None:
        why = chain_error(*position, meta, switch_from)
        if why is not None:
            raise DeltaError(f"{what}: {why}")
    removed = [r for r in removals if r is not None]
    gone = torch.unique(torch.cat(removed)) if removed else keys[:0]
    gone = gone[~torch.isin(gone, keys)]
    return TableDelta(keys, values.float(), gone, meta)

"""The files of a stream folder: deltas written and read, the stream's state
as its files say it.

A stream folder holds::

    <folder>/
      checkpoint/                  a DynamicEmbDump checkpoint (optional); every
                                   table's meta JSON records the delta sequence it
                                   reflects and its source (run, epoch, lineage)
      delta-000002-000000000007/   one published delta: epoch 2, sequence 7
        dynamicemb_delta.json      manifest, written last: run, epoch, lineage,
                                   sequence, per collection the tables with their
                                   meta and every file's size and CRC-32s, and a
                                   checksum of its own
        <collection>/<table>_<column>    little-endian rows, no header

A stream is one run (an id drawn when its first publisher started), in
epochs: a trainer restarted from a checkpoint of epoch ``p`` at sequence
``s`` publishes epoch ``e`` (one above every epoch in the folder) from
sequence ``s + 1`` on, and every delta of epoch ``e`` names its lineage, the
list of ``[epoch, parent epoch, parent sequence]`` of every restart that led
to it. The stream's path is the newest epoch's lineage: the sequences of
each ancestor epoch up to where its child started, then the child's.

A delta folder is written aside and published by one rename
(``dynamicemb.io.files``, as checkpoints are; in an object store into a
version prefix that its manifest, written last, commits), so a reader sees
a delta whole or not at all. The folder may be a URL (``s3://...``).
Reading verifies the manifest's checksum and every file's CRC-32s; the
replay verifies each table's own checksum.
"""

import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamicemb.checkpoint import files as checkpoint_files
from dynamicemb.checkpoint.layout import CheckpointError
from dynamicemb.checkpoint.read import table_meta
from dynamicemb.dynamicemb_config import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynamicemb.io import dtypes, files, fs
from dynamicemb.io.files import CHECKSUM_BLOCK_BYTES, FileInfo, check_name
from dynamicemb.replication.delta import (
    TENSOR_COLUMNS,
    DeltaDumpResult,
    DeltaError,
    meta_description,
)
from dynamicemb.types import EvictedItemMode

__all__ = [
    "CHECKPOINT_DIR",
    "DELTA_FORMAT",
    "StreamState",
    "delta_path",
    "list_deltas",
    "list_stream",
    "options_from",
    "path_of",
    "read_delta",
    "read_delta_manifest",
    "stream_state",
    "write_delta",
]

log = logging.getLogger(__name__)

DELTA_FORMAT = "dynamicemb-delta"
DELTA_VERSION = 2
DELTA_MANIFEST = "dynamicemb_delta.json"
CHECKPOINT_DIR = "checkpoint"
_DELTA_DIR = re.compile(r"^delta-(\d{6})-(\d{12})$")

# The columns written as files, one per table (slot_index is meta's).
_COLUMNS = TENSOR_COLUMNS + ("slot_index",)


def delta_path(folder: str, sequence: int, epoch: int = 0) -> fs.Location:
    return fs.at(folder).join(f"delta-{epoch:06d}-{sequence:012d}")


def list_stream(folder: str) -> list[tuple[int, int]]:
    """(epoch, sequence) of every published delta in ``folder``, ascending."""
    out = []
    for name in files.committed_children(folder, DELTA_MANIFEST):
        m = _DELTA_DIR.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2))))
    return sorted(out)


def list_deltas(folder: str, epoch: int | None = None) -> list[int]:
    """Sequences of the published deltas of ``epoch`` in ``folder`` (None:
    the newest epoch that has deltas), ascending."""
    stream = list_stream(folder)
    if epoch is None:
        epoch = stream[-1][0] if stream else 0
    return [s for e, s in stream if e == epoch]


def _column(entry: dict[str, Any], c: str) -> torch.Tensor | None:
    return entry["meta"]["slot_index"] if c == "slot_index" else entry[c]


def options_from(d: dict[str, Any]) -> DynamicEmbTableOptions:
    """Table options from their ``options_description``."""
    strategy = tuple(DynamicEmbScoreStrategy[s] for s in d["score_strategy"])
    return DynamicEmbTableOptions(
        dim=d["dim"],
        score_strategy=strategy if len(strategy) > 1 else strategy[0],
        dist_type=d["dist_type"],
        bucket_capacity=d["bucket_capacity"],
        max_capacity=d["max_capacity"],
        evicted_item_mode=EvictedItemMode[d["evicted_item_mode"]],
        training=d["training"],
        embedding_dtype=(
            None
            if d["embedding_dtype"] is None
            else dtypes.dtype_of(d["embedding_dtype"], "delta", DeltaError)
        ),
    )


def _source_of(deltas: dict[str, DeltaDumpResult]) -> tuple[str | None, int]:
    """The (run, epoch) the tables of ``deltas`` name (run None: they name
    different runs, each table keeps its own)."""
    metas = [m for d in deltas.values() for m in d.meta]
    runs = {m.get("run") for m in metas}
    epochs = {m.get("epoch") or 0 for m in metas}
    if len(epochs) > 1:
        raise DeltaError(f"the tables of one delta are of different epochs {sorted(epochs)}")
    return (runs.pop() if len(runs) == 1 else None), (epochs.pop() if epochs else 0)


def write_delta(
    folder: str,
    sequence: int,
    deltas: dict[str, DeltaDumpResult],
    lineage: list[list[int]] | None = None,
) -> str:
    """Publishes ``deltas`` as ``<folder>/delta-<epoch>-<sequence>``
    (atomically), the epoch and run its tables name; returns its path.
    ``lineage``: the epoch's (see the module docstring; default none).

    Raises:
        ValueError: the delta exists already (it is never replaced).
        DeltaError: the tables name different epochs.
    """
    run, epoch = _source_of(deltas)
    path = delta_path(folder, sequence, epoch)
    store = path.fs
    if store.renames and store.exists(path) or files.committed(path, DELTA_MANIFEST):
        raise ValueError(f"delta {sequence} of epoch {epoch} exists already at {path}")
    tmp = files.make_tmp(path)
    try:
        collections: dict[str, list[dict[str, Any]]] = {}
        for coll, delta in deltas.items():
            check_name(coll, "collection")
            store.mkdir(tmp.join(coll))
            tables = []
            for i in range(len(delta)):
                entry = delta.table(i)
                name = entry["table_names"]
                check_name(name, "table name")
                stored = {}
                for c in _COLUMNS:
                    t = _column(entry, c)
                    if t is None:
                        continue
                    t = t.detach().contiguous().cpu()
                    w = files.CheckedWriter(tmp.join(coll, f"{name}_{c}"), CHECKSUM_BLOCK_BYTES)
                    try:
                        w.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                        info = w.close()
                    except BaseException:
                        w.abort()
                        raise
                    stored[c] = {
                        "dtype": dtypes.dtype_name(t.dtype) if t.is_floating_point() else "int64",
                        "shape": list(t.shape),
                        "file": info.to_json(),
                    }
                meta = entry["meta"]
                tables.append(
                    {
                        "table": name,
                        "meta": meta_description(meta),
                        "checksum": meta.get("checksum"),
                        "columns": stored,
                    }
                )
            files.fsync_path(tmp.join(coll))
            collections[coll] = tables
        body = {
            "format": DELTA_FORMAT,
            "version": DELTA_VERSION,
            "run": run,
            "epoch": epoch,
            "lineage": [list(x) for x in lineage or []],
            "sequence": sequence,
            "checksum_block_bytes": CHECKSUM_BLOCK_BYTES,
            "collections": collections,
        }
        files.write_manifest(tmp, body, DELTA_MANIFEST)
        files.publish(tmp, path)
    except BaseException as e:
        store.rmtree(tmp)
        if files.committed(path, DELTA_MANIFEST) is None:
            raise
        # The rename (or the manifest, in an object store) published it:
        # readers may have it. What failed after made it durable only.
        log.warning("delta %d of epoch %d is published at %s, then: %r", sequence, epoch, path, e)
    return path


def read_delta_manifest(path: str) -> dict[str, Any]:
    """The verified manifest of a published delta (run, epoch, lineage,
    sequence, collections)."""
    path = fs.at(path)
    path = files.committed(path, DELTA_MANIFEST) or path
    return files.read_manifest(path, DELTA_MANIFEST, DELTA_FORMAT, DELTA_VERSION, DeltaError)


def _dtype(name: Any, where: str) -> torch.dtype:
    return torch.int64 if name == "int64" else dtypes.dtype_of(name, where, DeltaError)


def _check_file(coll: Any, table: Any, column: Any, info: dict[str, Any]) -> None:
    """A column's file as the format names it (``<table>_<column>`` in the
    collection's folder, nothing else: a manifest naming ``../x`` is refused)
    and of the size its dtype and shape give.

    Raises:
        ValueError: naming what is wrong.
    """
    check_name(coll, "collection")
    check_name(table, "table name")
    if column not in _COLUMNS:
        raise ValueError(f"table {table!r} has an unknown column {column!r}")
    name = info["file"]["file"]
    if name != f"{table}_{column}":
        raise ValueError(
            f"table {table!r} names the file {name!r} for its {column}, not {table}_{column}"
        )
    shape = info["shape"]
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"table {table!r}: the shape of its {column} is {shape!r}")
    itemsize = _dtype(info["dtype"], "the manifest").itemsize
    if math.prod(shape) * itemsize != int(info["file"]["bytes"]):
        raise ValueError(
            f"table {table!r}: its {column} of shape {shape} is not {info['file']['bytes']} bytes"
        )


def read_delta(
    path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, DeltaDumpResult]]:
    """Reads a published delta, verifying the manifest (or takes ``body``,
    its manifest read already) and every file.

    Returns:
        (sequence, {collection path: DeltaDumpResult}).

    Raises:
        DeltaError: a missing, truncated or corrupted file (named), or a
            manifest that names a file other than the format's (a path
            outside the delta's folder, ``../x``) or is malformed.
    """
    path = fs.at(path)
    path = files.committed(path, DELTA_MANIFEST) or path
    where = os.path.join(path, DELTA_MANIFEST)
    if body is None:
        body = read_delta_manifest(path)
    try:
        block = int(body["checksum_block_bytes"])
        for coll, tables in body["collections"].items():
            for t in tables:
                for c, info in t["columns"].items():
                    _check_file(coll, t["table"], c, info)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DeltaError(f"{where}: the manifest is malformed: {e}") from None
    out: dict[str, DeltaDumpResult] = {}
    for coll, tables in body["collections"].items():
        result = DeltaDumpResult()
        for t in tables:
            cols: dict[str, torch.Tensor | None] = dict.fromkeys(_COLUMNS)
            for c, info in t["columns"].items():
                tensor = torch.empty(info["shape"], dtype=_dtype(info["dtype"], where))
                files.read_verified(
                    path.join(coll),
                    FileInfo.from_json(info["file"]),
                    block,
                    f"delta {body['sequence']} table {t['table']!r}",
                    tensor,
                    DeltaError,
                )
                cols[c] = tensor
            desc = t["meta"]
            meta = {
                "current_score": desc["current_score"],
                "slot_index": cols["slot_index"],
                "current_capacity": desc["current_capacity"],
                "row_capacity": tuple(desc["row_capacity"]),
                "bucket_capacity": desc["bucket_capacity"],
                "num_scores": desc["num_scores"],
                "world_size": desc["world_size"],
                "table_options": options_from(desc["table_options"]),
                "sequence": desc["sequence"],
                "run": desc["run"],
                "epoch": desc["epoch"],
                "rank": desc["rank"],
                "checksum": t["checksum"],
            }
            result.append(
                {
                    "table_names": t["table"],
                    **{c: cols[c] for c in _COLUMNS if c != "slot_index"},
                    "meta": meta,
                }
            )
        out[coll] = result
    return int(body["sequence"]), out


# ------------------------------------------------------ the stream's state --


def path_of(source: dict[str, Any]) -> tuple[list[int], dict[int, float]]:
    """The epochs of ``source``'s path, oldest first, and the last sequence
    of each on it (the newest's: infinity)."""
    parents = {int(e): (int(p), int(s)) for e, p, s in source.get("lineage") or []}
    cur = int(source["epoch"])
    order, last = [cur], {cur: math.inf}
    while cur in parents:
        parent, seq = parents[cur]
        if parent in last:  # a cycle: a corrupted lineage ends the path
            break
        order.append(parent)
        last[parent] = seq
        cur = parent
    return order[::-1], last


@dataclass
class StreamState:
    """What a stream folder holds: its deltas, the newest source (run,
    epoch, lineage) and its sequence, the checkpoint's source and sequence."""

    deltas: set[tuple[int, int]] = field(default_factory=set)
    head: dict[str, Any] | None = None
    head_sequence: int = 0
    checkpoint: tuple[dict[str, Any] | None, int | None] | None = None
    max_epoch: int = -1


def checkpoint_position(folder: str) -> tuple[dict[str, Any] | None, int | None] | None:
    """(source, sequence) the stream's checkpoint records (None: no
    checkpoint, or one whose tables disagree)."""
    try:
        where, manifest = checkpoint_files.resolve(fs.at(folder).join(CHECKPOINT_DIR))
    except CheckpointError:
        return None
    if manifest is None:
        return None
    found = set()
    for coll, tables in manifest["collections"].items():
        for name in tables:
            _, meta = table_meta(where, manifest, coll, name, name)
            found.add((repr(meta.delta_source), meta.delta_sequence))
            source = meta.delta_source
    if len(found) != 1:
        return None
    return source, found.pop()[1]


def stream_state(folder: str) -> StreamState:
    """The stream folder's state (reads its listing, its newest delta's
    manifest and its checkpoint's table metas)."""
    state = StreamState(deltas=set(list_stream(folder)))
    try:
        state.checkpoint = checkpoint_position(folder)
    except CheckpointError:
        state.checkpoint = None
    epochs = [e for e, _ in state.deltas]
    ck_source = state.checkpoint[0] if state.checkpoint else None
    if ck_source is not None:
        epochs.append(int(ck_source["epoch"]))
    if not epochs:
        return state
    state.max_epoch = max(epochs)
    newest = max(state.deltas) if state.deltas else None
    if newest is not None and (ck_source is None or newest[0] >= int(ck_source["epoch"])):
        body = read_delta_manifest(delta_path(folder, newest[1], newest[0]))
        state.head = {"run": body["run"], "epoch": body["epoch"], "lineage": body["lineage"]}
        state.head_sequence = newest[1]
        if ck_source is not None and int(ck_source["epoch"]) == newest[0]:
            state.head_sequence = max(newest[1], state.checkpoint[1] or 0)
    else:
        state.head = dict(ck_source)
        state.head_sequence = state.checkpoint[1] or 0
    return state

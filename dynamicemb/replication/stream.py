"""Deltas as files: a training job publishes them into a folder, serving
replicas follow it.

A stream folder holds::

    <folder>/
      checkpoint/                  a DynamicEmbDump checkpoint (optional); its meta
                                   JSON records the delta sequence it reflects
      delta-000000000007/          one published delta (sequence 7)
        dynamicemb_delta.json      manifest, written last: sequence, per collection
                                   the tables with their meta and every file's
                                   size and CRC-32s, and a checksum of its own
        <collection>/<table>_<column>    little-endian rows, no header

A delta folder is written aside and published by one rename
(``dynamicemb.io.files``, as checkpoints are; in an object store into a
version prefix that its manifest, written last, commits), so a follower
sees a delta whole or not at all. The folder may be a URL (``s3://...``).
Reading verifies the manifest's checksum and every file's CRC-32s; the
replay verifies each table's own checksum and sequence.
"""

import os
import re
import time
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.checkpoint import files as checkpoint_files
from dynamicemb.checkpoint.layout import CheckpointError, TableMeta, meta_file
from dynamicemb.dynamicemb_config import (
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    ReplayContent,
)
from dynamicemb.io import Group, dtypes, files, fs
from dynamicemb.io.files import CHECKSUM_BLOCK_BYTES, FileInfo, check_name
from dynamicemb.replication.delta import (
    TENSOR_COLUMNS,
    DeltaDumpResult,
    DeltaError,
    meta_description,
)
from dynamicemb.replication.dump import incremental_dump
from dynamicemb.replication.replay import layout_mismatch, replay_by_key, replay_increment
from dynamicemb.replication.scores import get_score
from dynamicemb.shard.tables import collection_key, model_tables
from dynamicemb.types import EvictedItemMode, ReplayStats

__all__ = [
    "CHECKPOINT_DIR",
    "DELTA_FORMAT",
    "DeltaFollower",
    "DeltaPublisher",
    "delta_path",
    "list_deltas",
    "options_from",
    "read_delta",
    "write_delta",
]

DELTA_FORMAT = "dynamicemb-delta"
DELTA_VERSION = 1
DELTA_MANIFEST = "dynamicemb_delta.json"
CHECKPOINT_DIR = "checkpoint"
_DELTA_DIR = re.compile(r"^delta-(\d{12})$")

# The columns written as files, one per table (slot_index is meta's).
_COLUMNS = TENSOR_COLUMNS + ("slot_index",)


def delta_path(folder: str, sequence: int) -> str:
    return os.path.join(folder, f"delta-{sequence:012d}")


def list_deltas(folder: str) -> list[int]:
    """Sequences of the published deltas in ``folder``, ascending."""
    out = []
    for name in files.committed_children(folder, DELTA_MANIFEST):
        m = _DELTA_DIR.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


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


def write_delta(folder: str, sequence: int, deltas: dict[str, DeltaDumpResult]) -> str:
    """Publishes ``deltas`` as ``<folder>/delta-<sequence>`` (atomically);
    returns its path.

    Raises:
        ValueError: the delta exists already (it is never replaced).
    """
    path = delta_path(folder, sequence)
    store = fs.of(path)
    if store.renames and store.exists(path) or files.committed(path, DELTA_MANIFEST):
        raise ValueError(f"delta {sequence} exists already at {path}")
    tmp = files.make_tmp(path)
    try:
        collections: dict[str, list[dict[str, Any]]] = {}
        for coll, delta in deltas.items():
            check_name(coll, "collection")
            store.mkdir(os.path.join(tmp, coll))
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
                    w = files.CheckedWriter(
                        os.path.join(tmp, coll, f"{name}_{c}"), CHECKSUM_BLOCK_BYTES
                    )
                    w.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                    stored[c] = {
                        "dtype": dtypes.dtype_name(t.dtype) if t.is_floating_point() else "int64",
                        "shape": list(t.shape),
                        "file": w.close().to_json(),
                    }
                meta = entry["meta"]
                tables.append(
                    {
                        "table": name,
                        "meta": meta_description(meta),
                        "checksum": meta["checksum"],
                        "columns": stored,
                    }
                )
            files.fsync_path(os.path.join(tmp, coll))
            collections[coll] = tables
        body = {
            "format": DELTA_FORMAT,
            "version": DELTA_VERSION,
            "sequence": sequence,
            "checksum_block_bytes": CHECKSUM_BLOCK_BYTES,
            "collections": collections,
        }
        files.write_manifest(tmp, body, DELTA_MANIFEST)
        files.publish(tmp, path)
    except BaseException:
        store.rmtree(tmp)
        raise
    return path


def read_delta(path: str) -> tuple[int, dict[str, DeltaDumpResult]]:
    """Reads a published delta, verifying the manifest and every file.

    Returns:
        (sequence, {collection path: DeltaDumpResult}).

    Raises:
        DeltaError: a missing, truncated or corrupted file (named).
    """
    path = files.committed(path, DELTA_MANIFEST) or path
    where = os.path.join(path, DELTA_MANIFEST)
    body = files.read_manifest(path, DELTA_MANIFEST, DELTA_FORMAT, DELTA_VERSION, DeltaError)
    block = int(body["checksum_block_bytes"])
    out: dict[str, DeltaDumpResult] = {}
    for coll, tables in body["collections"].items():
        result = DeltaDumpResult()
        for t in tables:
            cols: dict[str, torch.Tensor | None] = dict.fromkeys(_COLUMNS)
            for c, info in t["columns"].items():
                dtype = (
                    torch.int64
                    if info["dtype"] == "int64"
                    else dtypes.dtype_of(info["dtype"], where, DeltaError)
                )
                tensor = torch.empty(info["shape"], dtype=dtype)
                files.read_verified(
                    os.path.join(path, coll),
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


def _sequence_of(deltas: dict[str, DeltaDumpResult]) -> int:
    seqs = {m["sequence"] for d in deltas.values() for m in d.meta}
    if len(seqs) != 1:
        raise DeltaError(
            f"the tables of one published delta must share a sequence number, got {sorted(seqs)}"
        )
    return seqs.pop()


def _model_sequence(model: torch.nn.Module) -> int | None:
    """The delta sequence every dynamic table of the model reflects."""
    seqs = {
        ref.rows.delta_sequence[ref.index]
        for refs in model_tables(model).values()
        for ref in refs.values()
    }
    if len(seqs) != 1:
        raise DeltaError(
            f"the model's dynamic tables reflect different delta sequences {sorted(seqs, key=str)}"
        )
    return seqs.pop()


class DeltaPublisher:
    """The training side of a stream folder: a checkpoint now and then, a
    delta after every step or few.

    Every rank calls every method (a delta gathers all ranks' rows; rank 0
    writes the files). The first delta holds what changed after the
    publisher was made: make it before training starts, or right after a
    ``checkpoint``. Tables with ``evicted_item_mode=RETAIN_KEY`` let
    replicas of any layout follow (``replay_by_key``).

    Args:
        model (torch.nn.Module): the sharded training model.
        folder (str): the stream folder (created when missing).
        pg (Optional[dist.ProcessGroup]): the sharding's group (default: the
            default group, or none in a single process).

    Example::

        pub = DeltaPublisher(model, "/streams/ctr")
        pub.checkpoint()
        for step, batch in enumerate(batches):
            train_step(model, batch)
            pub.publish()
    """

    def __init__(
        self, model: torch.nn.Module, folder: str, pg: dist.ProcessGroup | None = None
    ) -> None:
        self.model = model
        self.folder = folder
        self.group = Group(pg, DeltaError)
        if self.group.rank == 0:
            fs.of(folder).makedirs(folder)
        self.threshold = get_score(model)
        if self.threshold is None:
            raise ValueError("DeltaPublisher: the model has no dynamic embedding tables")

    def checkpoint(self, optim: bool = False, prune: bool = True) -> str:
        """Dumps the model to ``<folder>/checkpoint`` (``DynamicEmbDump``,
        replacing the previous one atomically); with ``prune``, then removes
        the deltas it makes unnecessary. Returns the checkpoint's path."""
        from dynamicemb.checkpoint import dump

        path = os.path.join(self.folder, CHECKPOINT_DIR)
        dump(path, self.model, optim=optim, pg=self.group.pg, show_progress=False)
        if prune and self.group.rank == 0:
            upto = _model_sequence(self.model) or 0
            for seq in list_deltas(self.folder):
                if seq <= upto:
                    fs.of(self.folder).rmtree(delta_path(self.folder, seq))
        self.group.barrier()
        return path

    def publish(self) -> int:
        """Dumps what changed since the previous delta and publishes it;
        returns its sequence number."""
        pg = self.group.pg if self.group.distributed else None
        deltas = incremental_dump(self.model, self.threshold, pg)
        self.threshold = {
            coll: {name: meta["current_score"] for name, meta in zip(d.table_names, d.meta)}
            for coll, d in deltas.items()
        }
        seq = _sequence_of(deltas)
        error = None
        if self.group.rank == 0:
            try:
                write_delta(self.folder, seq, deltas)
            except BaseException as e:
                error = e
        self.group.agree(error)
        return seq


class DeltaFollower:
    """The serving side of a stream folder: loads its checkpoint, then
    replays its deltas in order as they appear.

    Every rank of a sharded replica calls every method; rank 0 decides what
    to apply. A delta missing from the folder (pruned after a newer
    checkpoint) makes the follower load that checkpoint again.

    Args:
        model (torch.nn.Module): the sharded serving model.
        folder (str): the stream folder.
        content (ReplayContent): what a replay writes besides embeddings.
        mode (str): ``"slot"`` (``replay_increment``: the replica has the
            source's layout and was built only by replays), ``"key"``
            (``replay_by_key``: any layout), or ``"auto"`` (the default):
            by slot while the replica was built by replays alone and its
            layout matches the delta's, else by key.
        pg (Optional[dist.ProcessGroup]): the sharding's group.
    """

    MODES = ("auto", "slot", "key")
    # Consecutive polls that may fail to read a delta or checkpoint (one being
    # replaced or pruned meanwhile) before the error is raised.
    MAX_MISSES = 3

    def __init__(
        self,
        model: torch.nn.Module,
        folder: str,
        content: ReplayContent = ReplayContent.ALL,
        mode: str = "auto",
        pg: dist.ProcessGroup | None = None,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"DeltaFollower: mode must be one of {self.MODES}, got {mode!r}")
        self.model = model
        self.folder = folder
        self.content = content
        self.mode = mode
        self.group = Group(pg, DeltaError)
        self.loaded_checkpoint = False
        self.stats: dict[str, dict[str, ReplayStats]] = {}
        self._misses = 0

    @property
    def sequence(self) -> int | None:
        """The delta sequence the model reflects."""
        return _model_sequence(self.model)

    def _checkpoint(self) -> tuple[str, dict[str, Any]] | None:
        """The stream's checkpoint folder and manifest, or None."""
        try:
            folder, manifest = checkpoint_files.resolve(os.path.join(self.folder, CHECKPOINT_DIR))
        except CheckpointError:
            return None
        return None if manifest is None else (folder, manifest)

    def load_checkpoint(self) -> bool:
        """Loads ``<folder>/checkpoint`` if there is one (with its optimizer
        state when it has some and the replica's tables keep state); returns
        whether."""
        from dynamicemb.checkpoint import load

        found = self._checkpoint()
        optim = found is not None and bool(found[1].get("optim"))
        there, optim = self.group.broadcast_object((found is not None, optim))
        if not there:
            return False
        optim = optim and all(
            ref.rows.training_state
            for refs in model_tables(self.model).values()
            for ref in refs.values()
        )
        for attempt in range(self.MAX_MISSES + 1):
            try:
                load(
                    os.path.join(self.folder, CHECKPOINT_DIR),
                    self.model,
                    optim=optim,
                    pg=self.group.pg,
                    show_progress=False,
                )
                break
            except CheckpointError:
                # Replaced while being read (a load that fails changes
                # nothing): read the newer one.
                if attempt == self.MAX_MISSES:
                    raise
                time.sleep(0.1)
        self.loaded_checkpoint = True
        return True

    def _checkpoint_sequence(self) -> int | None:
        """The delta sequence the stream's checkpoint reflects (None: no
        checkpoint, or one whose tables disagree)."""
        found = self._checkpoint()
        if found is None:
            return None
        folder, manifest = found
        seqs = set()
        for coll, tables in manifest["collections"].items():
            for name, info in tables.items():
                data = files.read_small(
                    os.path.join(folder, coll),
                    FileInfo.from_json(info),
                    meta_file(name),
                    name,
                    CheckpointError,
                )
                seqs.add(TableMeta.decode(data, name).delta_sequence)
        return seqs.pop() if len(seqs) == 1 else None

    def _by_key(self, deltas: dict[str, DeltaDumpResult]) -> bool:
        if self.mode != "auto":
            return self.mode == "key"
        if self.loaded_checkpoint:
            return True
        tables = model_tables(self.model)
        for coll, delta in deltas.items():
            folder = collection_key(coll, tables)
            for name, meta in zip(delta.table_names, delta.meta):
                ref = tables[folder].get(name)
                if ref is not None and layout_mismatch(ref, meta) is not None:
                    return True
        return False

    def poll(self) -> list[int]:
        """Applies every delta published since the last one the model
        reflects, in order; returns their sequence numbers.

        Raises:
            DeltaError: the next delta is missing and no checkpoint covers
                it, or a delta is refused (the model is left as after the
                last delta applied).
        """
        current = self.sequence or 0
        plan = None
        if self.group.rank == 0:
            plan = [s for s in list_deltas(self.folder) if s > current]
            if plan and plan[0] != current + 1:
                ckpt = self._checkpoint_sequence()
                if ckpt is not None and ckpt >= plan[0] - 1:
                    plan = ["checkpoint"] + [s for s in plan if s > ckpt]
        plan = self.group.broadcast_object(plan)
        applied = []
        for item in plan:
            try:
                if item == "checkpoint":
                    self.load_checkpoint()
                    continue
                seq, deltas = read_delta(delta_path(self.folder, item))
            except (CheckpointError, DeltaError):
                # Replaced or pruned while being read (a newer checkpoint was
                # published): the next poll starts from what is there then.
                self._misses += 1
                if self._misses > self.MAX_MISSES:
                    raise
                break
            self._misses = 0
            current = self.sequence
            if current is not None and seq != current + 1:
                what = (
                    "a duplicate" if seq <= current else f"deltas {current + 1}..{seq - 1} missing"
                )
                raise DeltaError(
                    f"DeltaFollower: delta {seq} does not follow delta {current} ({what})"
                )
            replay = replay_by_key if self._by_key(deltas) else replay_increment
            self.stats = replay(self.model, deltas, self.content)
            applied.append(seq)
        return applied

    def follow(self, stop, interval: float = 0.5, on_applied=None) -> None:
        """Polls until ``stop()`` is true, sleeping ``interval`` seconds
        between polls; calls ``on_applied(sequences)`` after each poll that
        applied something."""
        while not stop():
            applied = self.poll()
            if applied and on_applied is not None:
                on_applied(applied)
            time.sleep(interval)

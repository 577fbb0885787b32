"""Deltas as files: a training job publishes them into a folder, serving
replicas follow it (the folder's files: ``stream_files.py``).

What the stream guarantees:

* Identity. Every delta and the stream's checkpoint name their run, epoch
  and sequence. A publisher continues the stream its model belongs to (the
  model loaded the stream's checkpoint, or published into it already) and
  refuses a folder that holds another run's stream. A model restarted from
  a checkpoint behind the stream's newest delta publishes a new epoch from
  the checkpoint's sequence on, so an old sequence number is never reused.
* Failed publishes change nothing. A publish whose files cannot be written
  (disk full, an I/O error, a rank that fails) leaves the folder, the tables'
  sequences and the publisher's threshold as they were; the keys its delta
  carried as erased or evicted go out with the next publish, which also
  holds every row the failed one did.
* A follower holds one run's rows at one sequence of the stream's path:
  it applies the deltas that follow its position, switches epochs where the
  stream's lineage says, loads the checkpoint when the deltas it needs are
  gone (pruned) or its position is off the path (an epoch abandoned by a
  restart), and refuses (``DeltaError``, changing nothing) a delta of
  another run, one that does not follow (a gap, a duplicate) and a stream of
  another run.
"""

import os
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.checkpoint.layout import CheckpointError
from dynamicemb.dynamicemb_config import ReplayContent
from dynamicemb.io import Group, fs
from dynamicemb.io.files import TMP_TAG
from dynamicemb.replication.delta import DeltaDumpResult, DeltaError
from dynamicemb.replication.dump import dump_delta, new_source
from dynamicemb.replication.follow import DeltaFollower, StreamReplica
from dynamicemb.replication.replay import (
    check_follows,
    layout_mismatch,
    replay_by_key,
    replay_increment,
)
from dynamicemb.replication.scores import get_score
from dynamicemb.replication.stream_files import (
    CHECKPOINT_DIR,
    DELTA_FORMAT,
    StreamState,
    delta_path,
    list_deltas,
    list_stream,
    options_from,
    read_delta,
    stream_state,
    write_delta,
)
from dynamicemb.shard.tables import collection_key, model_tables

__all__ = [
    "CHECKPOINT_DIR",
    "DELTA_FORMAT",
    "DeltaFollower",
    "DeltaPublisher",
    "ModelReplica",
    "StreamReplica",
    "delta_path",
    "list_deltas",
    "list_stream",
    "options_from",
    "read_delta",
    "write_delta",
]


def _refs(model: torch.nn.Module) -> list:
    return [ref for refs in model_tables(model).values() for ref in refs.values()]


def _model_sequence(model: torch.nn.Module) -> int | None:
    """The delta sequence every dynamic table of the model reflects."""
    seqs = {ref.rows.delta_sequence[ref.index] for ref in _refs(model)}
    if len(seqs) != 1:
        raise DeltaError(
            f"the model's dynamic tables reflect different delta sequences {sorted(seqs, key=str)}"
        )
    return seqs.pop()


def _model_source(model: torch.nn.Module) -> dict[str, Any] | None:
    """The source (run, epoch, lineage) of the model's tables: the one they
    share (tables with none left out; None: none has one)."""
    found = {repr(s): s for s in (ref.rows.delta_source[ref.index] for ref in _refs(model)) if s}
    if len(found) > 1:
        raise DeltaError(
            f"the model's dynamic tables come from different runs or epochs {list(found.values())}"
        )
    return next(iter(found.values()), None)


def _stamp(model: torch.nn.Module, sequence: int, source: dict[str, Any]) -> None:
    for ref in _refs(model):
        ref.rows.delta_sequence[ref.index] = sequence
        ref.rows.delta_source[ref.index] = {
            **source,
            "lineage": [list(x) for x in source["lineage"]],
        }


def _removals(deltas: dict[str, DeltaDumpResult]) -> dict[tuple[str, str], dict]:
    """The erased and evicted keys of every table of ``deltas``."""
    return {
        (coll, name): {"erased_keys": er, "evicted_keys": ev}
        for coll, d in deltas.items()
        for name, er, ev in zip(d.table_names, d.erased_keys, d.evicted_keys)
    }


def _continuation(
    folder: str, mine: dict[str, Any] | None, sequence: int, state: StreamState
) -> tuple[dict[str, Any], int]:
    """The source and sequence a publisher of a model at (``mine``,
    ``sequence``) continues the stream in ``folder`` with."""
    if state.head is None:  # nothing published here yet
        return (mine or new_source()), sequence
    run = state.head["run"]
    if mine is None or mine["run"] != run:
        whose = "has published no delta" if mine is None else f"comes from run {mine['run']}"
        raise DeltaError(
            f"DeltaPublisher: {folder} holds the delta stream of run {run}, and this model "
            f"{whose}: load {os.path.join(folder, CHECKPOINT_DIR)} into the model to continue "
            "that stream, or publish into another folder"
        )
    if mine["epoch"] == state.head["epoch"] and state.head_sequence <= sequence:
        return mine, state.head_sequence  # the stream's head: continue its epoch
    epoch = state.max_epoch + 1  # a restart behind the head: a new epoch
    return {
        "run": run,
        "epoch": epoch,
        "lineage": [list(x) for x in mine["lineage"]] + [[epoch, mine["epoch"], sequence]],
    }, sequence


class DeltaPublisher:
    """The training side of a stream folder: a checkpoint now and then, a
    delta after every step or few.

    Every rank calls every method (a delta gathers all ranks' rows; rank 0
    writes the files). The first delta holds what changed after the
    publisher was made: make it before training starts, or right after a
    ``checkpoint``. Tables with ``evicted_item_mode=RETAIN_KEY`` let
    replicas of any layout follow (``replay_by_key``). A trainer restarted
    from the stream's checkpoint makes a publisher on the same folder: it
    continues the stream (a new epoch when the stream went on past that
    checkpoint). Do not ``incremental_dump`` a published model otherwise: a
    dump drains the keys the tables recorded as removed, which the stream's
    next delta would have carried.

    Args:
        model (torch.nn.Module): the sharded training model.
        folder (str): the stream folder (created when missing).
        pg (Optional[dist.ProcessGroup]): the sharding's group (default: the
            default group, or none in a single process).

    Raises:
        DeltaError: ``folder`` holds the stream of another run (or the model
            follows none): load the stream's checkpoint first, or use
            another folder.

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
        self.group = Group(pg, DeltaError)
        self.threshold = get_score(model)
        if self.threshold is None:
            raise ValueError("DeltaPublisher: the model has no dynamic embedding tables")
        mine = _model_source(model)
        sequence = max(ref.rows.delta_sequence[ref.index] or 0 for ref in _refs(model))
        decided, error = None, None
        try:
            # The stream folder, resolved to its filesystem once for all.
            self.folder = fs.at(folder)
            if self.group.rank == 0:
                self.folder.fs.makedirs(self.folder)
                decided = _continuation(self.folder, mine, sequence, stream_state(self.folder))
        except BaseException as e:
            error = e
        self.group.agree(error)
        self.source, self.sequence = self.group.broadcast_object(decided)
        _stamp(model, self.sequence, self.source)
        # Removed keys of failed publishes, for the next one.
        self._carried: dict[tuple[str, str], dict] = {}

    @property
    def epoch(self) -> int:
        return self.source["epoch"]

    @property
    def run(self) -> str:
        return self.source["run"]

    def checkpoint(self, optim: bool = False, prune: bool = True) -> str:
        """Dumps the model to ``<folder>/checkpoint`` (``DynamicEmbDump``,
        replacing the previous one atomically), recording the stream's
        position; with ``prune``, then removes the deltas it makes
        unnecessary (every delta but the epoch's after it, and what a
        publisher that died left half written). Returns the checkpoint's
        path."""
        from dynamicemb.checkpoint import dump

        path = self.folder.join(CHECKPOINT_DIR)
        _stamp(self.model, self.sequence, self.source)
        dump(path, self.model, optim=optim, pg=self.group.pg, show_progress=False)
        if prune and self.group.rank == 0:
            store = self.folder.fs
            for epoch, seq in list_stream(self.folder):
                if epoch != self.epoch or seq <= self.sequence:
                    store.rmtree(delta_path(self.folder, seq, epoch))
            for name in store.listdir(self.folder):  # left by a publisher that died
                if name.startswith("delta-") and TMP_TAG in name:
                    store.rmtree(self.folder.join(name))
        self.group.barrier()
        return path

    def publish(self) -> int:
        """Dumps what changed since the previous delta and publishes it;
        returns its sequence number. A publish that fails raises and
        changes nothing (see the module docstring)."""
        pg = self.group.pg if self.group.distributed else None
        seq = self.sequence + 1
        dumped = dump_delta(
            self.model, self.threshold, pg, sequence=seq, source=self.source, carried=self._carried
        )
        error = None
        if self.group.rank == 0:
            try:
                write_delta(self.folder, seq, dumped.deltas, self.source["lineage"])
            except BaseException as e:
                error = e
        try:
            self.group.agree(error)
        except BaseException:
            self._carried = _removals(dumped.deltas)
            raise
        dumped.commit()
        self._carried = {}
        self.sequence = seq
        self.threshold = {
            coll: {name: meta["current_score"] for name, meta in zip(d.table_names, d.meta)}
            for coll, d in dumped.deltas.items()
        }
        return seq


class ModelReplica(StreamReplica):
    """The dynamic tables of a sharded model as a ``StreamReplica``: what
    ``DeltaFollower`` follows for a model. A checkpoint loads with
    ``DynamicEmbLoad`` (with its optimizer state when it has some and the
    tables keep state); a delta replays by slot or by key (``mode``, as
    ``DeltaFollower`` says) after ``check_follows``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        content: ReplayContent = ReplayContent.ALL,
        mode: str = "auto",
        pg: dist.ProcessGroup | None = None,
    ) -> None:
        self.model = model
        self.content = content
        self.mode = mode
        self.group = Group(pg, DeltaError)
        self.loaded_checkpoint = False

    def stream_position(self) -> tuple[dict[str, Any] | None, int | None]:
        return _model_source(self.model), _model_sequence(self.model)

    def load_stream_checkpoint(self, path: str) -> None:
        from dynamicemb.checkpoint import files as checkpoint_files
        from dynamicemb.checkpoint import load

        path = fs.at(path)  # the one resolution of the path to its filesystem
        optim = False
        if self.group.rank == 0:
            try:
                _, manifest = checkpoint_files.resolve(path)
                optim = manifest is not None and bool(manifest.get("optim"))
            except CheckpointError:
                pass
        optim = self.group.broadcast_object(optim)
        optim = optim and all(ref.rows.training_state for ref in _refs(self.model))
        load(path, self.model, optim=optim, pg=self.group.pg, show_progress=False)
        self.loaded_checkpoint = True

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

    def apply_stream_delta(self, deltas, lineage, switch_from):
        # Arguments, result and refusals: StreamReplica.apply_stream_delta.
        check_follows(self.model, deltas, switch_from=switch_from)
        replay = replay_by_key if self._by_key(deltas) else replay_increment
        stats = replay(self.model, deltas, self.content)
        for ref in _refs(self.model):
            if ref.rows.delta_source[ref.index] is not None:
                ref.rows.delta_source[ref.index]["lineage"] = [list(x) for x in lineage]
        return stats

"""The serving side of a stream folder: ``DeltaFollower`` keeps a replica at
the head of the stream's path, whatever the replica is.

A replica is a ``StreamReplica``: a sharded model's dynamic tables (stream.py
wraps a model in one) or ``dynamicemb.inference.InferenceEmbeddingTable``.
The follower decides what to apply from the folder's files alone (its
deltas, their lineage, the checkpoint's position; ``stream_files.py``) and
the replica's position; the replica loads a checkpoint or applies a delta,
refusing (``DeltaError``, changing nothing) one that does not continue its
chain (``chain_error``). Nothing here imports a model's code: a replica that
is not a model needs neither the sharders nor the training module.
"""

import abc
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb._checks import is_int
from dynamicemb.checkpoint.layout import CheckpointError
from dynamicemb.dynamicemb_config import ReplayContent
from dynamicemb.io import Group, fs
from dynamicemb.replication.delta import DeltaDumpResult, DeltaError
from dynamicemb.replication.stream_files import (
    CHECKPOINT_DIR,
    StreamState,
    delta_path,
    path_of,
    read_delta,
    read_delta_manifest,
    stream_state,
)
from dynamicemb.types import ReplayStats

__all__ = ["DeltaFollower", "StreamReplica", "chain_error"]


class StreamReplica(abc.ABC):
    """What a ``DeltaFollower`` keeps current: rows that follow one stream.

    A replica knows its position, loads a stream's checkpoint and applies a
    stream's delta, each all or nothing.
    """

    @abc.abstractmethod
    def stream_position(self) -> tuple[dict[str, Any] | None, int | None]:
        """(source, sequence): the run, epoch and lineage of the stream the
        replica follows (None: none yet) and the sequence of the last delta
        it reflects (None: it reflects no delta of a stream).

        Raises:
            DeltaError: the replica's tables reflect different positions.
        """

    @abc.abstractmethod
    def load_stream_checkpoint(self, path: str) -> None:
        """Replaces every row with the checkpoint at ``path`` (a
        ``DynamicEmbDump`` folder); the position becomes the checkpoint's.

        Raises:
            CheckpointError: the checkpoint cannot be read (the replica is
                as it was).
        """

    @abc.abstractmethod
    def apply_stream_delta(
        self,
        deltas: dict[str, DeltaDumpResult],
        lineage: list[list[int]],
        switch_from: int | None,
    ) -> dict[str, dict[str, ReplayStats]]:
        """Applies one delta of the stream (``deltas``: per collection) and
        takes ``lineage`` as its source's; ``switch_from``: the epoch the
        replica leaves for the delta's (None: the delta is of the replica's
        epoch). Returns per collection and table what was applied.

        Raises:
            DeltaError: the delta does not continue the replica's chain
                (``chain_error``); nothing is applied.
        """


def chain_error(
    source: dict[str, Any] | None,
    current: int | None,
    meta: dict[str, Any],
    switch_from: int | None,
) -> str | None:
    """Why a delta of one table (its ``meta``) does not continue the chain
    of a table at (``source``, ``current``) (None: it does): not numbered,
    another run's (foreign), of another epoch (unless the caller planned the
    switch from ``switch_from``), a duplicate, or one after a gap."""
    seq = meta.get("sequence")
    if not is_int(seq):
        return "the delta is not numbered (no meta['sequence'])"
    if source is not None and meta.get("run") != source["run"]:
        return (
            f"delta {seq} is foreign: it comes from run {meta.get('run')}, the table follows "
            f"run {source['run']}"
        )
    epoch = meta.get("epoch", 0)
    if source is not None and epoch != source["epoch"] and switch_from != source["epoch"]:
        return f"delta {seq} is of epoch {epoch}, the table follows epoch {source['epoch']}"
    if current is None:
        return None
    if seq <= current:
        return f"delta {seq} is a duplicate: the table reflects delta {current} already"
    if seq > current + 1:
        missing = f"{current + 1}..{seq - 1}"
        return f"delta {seq} does not follow delta {current}: deltas {missing} are missing"
    return None


@dataclass
class _Walk:
    """The deltas that take a position along the stream's path."""

    steps: list[tuple[int, int]]
    end: tuple[int, int]  # (index of its epoch on the path, sequence)
    complete: bool  # caught up with the stream's newest delta (or checkpoint)


def _walk(state: StreamState, source: dict[str, Any] | None, seq: int | None) -> _Walk | None:
    """The deltas from a position (``source``, ``seq``) to the head of the
    stream's path; None: the position is not on the path (another run, an
    abandoned epoch, an unknown sequence)."""
    order, last = path_of(state.head)
    if seq is None:
        return None
    if source is None:
        epoch = order[0]  # a replica that applied nothing yet: the start of the path
    else:
        if source["run"] != state.head["run"] or source["epoch"] not in last:
            return None
        epoch = int(source["epoch"])
    if seq > last[epoch]:
        return None
    steps = []
    for i in range(order.index(epoch), len(order)):
        x = order[i]
        while seq < last[x] and (x, seq + 1) in state.deltas:
            seq += 1
            steps.append((x, seq))
        if i + 1 < len(order) and seq < last[x]:  # an ancestor's delta is missing
            return _Walk(steps, (i, seq), False)
    return _Walk(steps, (len(order) - 1, seq), seq >= state.head_sequence)


class DeltaFollower:
    """The serving side of a stream folder: loads its checkpoint, then
    replays its deltas in order as they appear.

    Every rank of a sharded replica calls every method; rank 0 decides what
    to apply. A follower whose next delta is gone from the folder (pruned
    after a newer checkpoint), whose position a restarted trainer abandoned,
    or whose tables a replay interrupted part way left at different
    positions, loads the checkpoint again.

    Args:
        model (torch.nn.Module or StreamReplica): the sharded serving model,
            or a replica of another kind (an ``InferenceEmbeddingTable``),
            which one process follows alone.
        folder (str): the stream folder.
        content (ReplayContent): what a replay writes into a model's tables
            besides embeddings.
        mode (str): how a model's tables replay: ``"slot"``
            (``replay_increment``: the replica has the source's layout and
            was built only by replays), ``"key"`` (``replay_by_key``: any
            layout), or ``"auto"`` (the default): by slot while the replica
            was built by replays alone and its layout matches the delta's,
            else by key.
        pg (Optional[dist.ProcessGroup]): the sharding's group of a model.

    Raises:
        ValueError: an unknown ``mode``; ``content``, ``mode`` or ``pg`` other
            than the defaults for a replica that is not a model.
    """

    MODES = ("auto", "slot", "key")
    # Consecutive polls that may fail to read a delta or checkpoint (one being
    # replaced or pruned meanwhile) before the error is raised.
    MAX_MISSES = 3

    def __init__(
        self,
        model: torch.nn.Module | StreamReplica,
        folder: str,
        content: ReplayContent = ReplayContent.ALL,
        mode: str = "auto",
        pg: dist.ProcessGroup | None = None,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"DeltaFollower: mode must be one of {self.MODES}, got {mode!r}")
        if isinstance(model, StreamReplica):
            if content != ReplayContent.ALL or mode != "auto" or pg is not None:
                raise ValueError(
                    f"DeltaFollower: content, mode and pg are a model's; a "
                    f"{type(model).__name__} is followed by one process with the defaults"
                )
            self.replica = model
            self.group = Group.local(DeltaError)
        else:
            from dynamicemb.replication.stream import ModelReplica

            self.replica = ModelReplica(model, content, mode, pg)
            self.group = self.replica.group
        self.model = model
        # The stream folder, resolved to its filesystem once for all.
        self.folder = fs.at(folder)
        self.content = content
        self.mode = mode
        self.loaded_checkpoint = False
        self.stats: dict[str, dict[str, ReplayStats]] = {}
        self._misses = 0

    @property
    def sequence(self) -> int | None:
        """The delta sequence the replica reflects."""
        return self.replica.stream_position()[1]

    @property
    def position(self) -> tuple[str | None, int, int | None]:
        """(run, epoch, sequence) the replica reflects (run None: no delta or
        checkpoint of a stream applied yet)."""
        source, seq = self.replica.stream_position()
        if source is None:
            return None, 0, seq
        return source["run"], source["epoch"], seq

    def load_checkpoint(self) -> bool:
        """Loads ``<folder>/checkpoint`` if there is one; returns whether."""
        from dynamicemb.checkpoint import files as checkpoint_files

        path = self.folder.join(CHECKPOINT_DIR)
        try:
            checkpoint_files.resolve(path)
            there = True
        except CheckpointError:
            there = False
        if not self.group.broadcast_object(there):
            return False
        for attempt in range(self.MAX_MISSES + 1):
            try:
                self.replica.load_stream_checkpoint(path)
                break
            except CheckpointError:
                # Replaced while being read (a load that fails changes
                # nothing): read the newer one.
                if attempt == self.MAX_MISSES:
                    raise
                time.sleep(0.1)
        self.loaded_checkpoint = True
        return True

    def _plan(self) -> list | None:
        """What to apply, in order: "checkpoint" or (epoch, sequence); None:
        the folder could not be read this time."""
        try:
            state = stream_state(self.folder)
        except (CheckpointError, DeltaError):
            # A delta or checkpoint replaced or pruned while being read: the
            # next poll reads what is there then.
            self._misses += 1
            if self._misses > self.MAX_MISSES:
                raise
            return None
        if state.head is None:
            return []
        try:
            source, seq = self.replica.stream_position()
        except DeltaError as e:
            # Tables at different positions: a replay interrupted after some
            # of its tables (the others as before it). The checkpoint puts
            # them all at one position again.
            if state.checkpoint is None:
                raise DeltaError(
                    f"DeltaFollower: {e} (a replay was interrupted) and {self.folder} has no "
                    "checkpoint to load them all from"
                ) from None
            theirs = _walk(state, *state.checkpoint)
            return ["checkpoint"] + (theirs.steps if theirs is not None else [])
        if source is not None and source["run"] != state.head["run"]:
            raise DeltaError(
                f"DeltaFollower: the newest delta in {self.folder} comes from run "
                f"{state.head['run']}, foreign to the run {source['run']} the replica follows; "
                "nothing applied (load the folder's checkpoint, load_checkpoint, to follow a new "
                "stream there)"
            )
        mine = _walk(state, source, seq)
        if mine is not None and mine.complete:
            return mine.steps
        if state.checkpoint is not None:
            theirs = _walk(state, *state.checkpoint)
            if theirs is not None and (mine is None or theirs.end > mine.end or theirs.complete):
                return ["checkpoint"] + theirs.steps
        if mine is None:
            raise DeltaError(
                f"DeltaFollower: the replica's position (epoch {source and source['epoch']}, "
                f"delta {seq}) is not on the stream's path and no checkpoint is"
            )
        if not mine.steps:
            raise DeltaError(
                f"DeltaFollower: the delta after {seq} is missing from {self.folder} and no "
                "checkpoint covers it"
            )
        return mine.steps

    def poll(self) -> list[int]:
        """Applies every delta published since the last one the replica
        reflects, in order (loading the checkpoint where the stream says);
        returns their sequence numbers.

        Raises:
            DeltaError: a delta or stream of another run, a delta that does
                not follow, a missing delta no checkpoint covers (the replica
                is left as after the last delta applied).
        """
        plan, error = None, None
        if self.group.rank == 0:
            try:
                plan = self._plan()
            except (CheckpointError, DeltaError) as e:
                error = e
        self.group.agree(error)
        plan = self.group.broadcast_object(plan)
        if plan is None:
            return []
        if not plan:
            self._misses = 0
        applied = []
        for item in plan:
            try:
                if item == "checkpoint":
                    self.load_checkpoint()
                    continue
                epoch, seq = item
                path = delta_path(self.folder, seq, epoch)
                body = read_delta_manifest(path)
                got, deltas = read_delta(path, body)
            except (CheckpointError, DeltaError):
                # Replaced or pruned while being read (a newer checkpoint was
                # published): the next poll starts from what is there then.
                self._misses += 1
                if self._misses > self.MAX_MISSES:
                    raise
                break
            self._misses = 0
            if (got, body["epoch"]) != (seq, epoch):
                raise DeltaError(
                    f"DeltaFollower: {path} holds delta {got} of epoch {body['epoch']}"
                )
            source, _ = self.replica.stream_position()
            switch = source["epoch"] if source is not None and source["epoch"] != epoch else None
            self.stats = self.replica.apply_stream_delta(deltas, body["lineage"], switch)
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

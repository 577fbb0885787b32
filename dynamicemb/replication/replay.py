"""The serving side of replication: replaying deltas into a model.

Two ways to write a delta, one validation:

* ``replay_increment`` writes every key at the slot it held in the source
  (``meta["slot_index"]``), so the replica stays layout-identical to the
  source: same capacity, bucket width, score columns and world size, or a
  ``ValueError`` naming the first field that differs. The source's
  evictions need no record: the key that took an evicted key's slot
  overwrites it.
* ``replay_by_key`` writes every key by this replica's own layout (its own
  routing to ranks, capacity and buckets): any world size, any capacity. It
  cannot see an eviction happen, so it needs the keys the source evicted
  (the delta's ``evicted_keys``, recorded with ``evicted_item_mode=RETAIN_KEY``).

Both first remove the delta's erased keys and, where the source retains
them, its evicted keys (those the delta does not write again). A replay by
slot needs the latter in one case: a key that evicted another and was
erased in the same interval leaves its slot empty, and nothing else tells a
replica that the evicted key is gone.

Everything is checked, for every table of every collection in the deltas,
before anything is written: the checksum where the delta has one (a
corrupted delta), the columns' shapes and the layout. A refused replay
changes nothing. Any well-formed delta of a matching layout applies: one
built by hand (no sequence, no checksum), one after a dump nobody replayed,
another rank's (its keys are skipped). The order of deltas is the stream's
concern (``stream.py``); a replay records the sequence of the delta it
applied (``TableRows.delta_sequence``).
"""

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb._checks import is_int
from dynamicemb.dynamicemb_config import ReplayContent
from dynamicemb.replication.delta import (
    DeltaDumpResult,
    DeltaError,
    check_delta_intact,
    check_delta_meta,
    check_delta_rows,
    delta_column,
)
from dynamicemb.replication.follow import chain_error
from dynamicemb.replication.scores import table_scores
from dynamicemb.replication.tables import check_routable, owned, world_of
from dynamicemb.shard.tables import TableRef, collection_key, model_tables
from dynamicemb.table import enums
from dynamicemb.types import ReplayStats

__all__ = ["check_follows", "layout_mismatch", "replay_by_key", "replay_increment"]


@dataclass
class _Job:
    ref: TableRef
    entry: dict[str, Any]
    sequence: int | None


def layout_mismatch(ref: TableRef, meta: dict[str, Any]) -> str | None:
    """The first layout field in which a delta's table (its ``meta``) and
    ``ref`` differ, as ``"field: delta X, table Y"``; None if they match (a
    replay by slot is possible)."""
    ours = dict(ref.rows.layout_of(ref.index), world_size=ref.sharding_world_size or 1)
    for field in (
        "current_capacity",
        "row_capacity",
        "bucket_capacity",
        "num_scores",
        "world_size",
    ):
        theirs = meta.get(field)
        if field == "row_capacity" and theirs is not None:
            theirs = tuple(theirs)
        if theirs != ours[field]:
            return f"{field}: delta {theirs}, table {ours[field]}"
    opts = meta["table_options"]
    mine = ref.options
    for field in ("score_strategy", "dim", "dist_type"):
        if getattr(opts, field) != getattr(mine, field):
            return (
                f"table_options.{field}: delta {getattr(opts, field)}, table {getattr(mine, field)}"
            )
    return None


def _fail(ref: TableRef, message: str) -> ValueError:
    return ValueError(f"replay: {ref.label}: {message}")


def _check_entry(ref: TableRef, entry: dict[str, Any], content: ReplayContent, by_key: bool):
    """Everything a replay of one table needs, checked; returns its sequence
    (None: the delta is not numbered)."""
    what = f"replay: {ref.label}"
    meta = check_delta_meta(entry, what)
    if not by_key:
        check_routable(ref, "replay_increment")
    ref.rows.check_delta("replay_by_key" if by_key else "replay_increment")
    if meta["table_options"].dist_type == "continuous":
        raise NotImplementedError(
            f"replay: {ref.label}: the delta comes from a table with dist_type='continuous'"
        )
    keys = check_delta_intact(entry, what)
    n = keys.numel()
    m, t = ref.rows, ref.index
    mismatch = layout_mismatch(ref, meta)
    if not by_key and mismatch is not None:
        raise _fail(
            ref,
            f"layout mismatch, {mismatch}; a replay by slot needs the source's layout (configure "
            "the table as the source, reload a checkpoint, or replay by key)",
        )
    opts, mine = meta["table_options"], m.options[t]
    for field in ("dim", "score_strategy"):
        if getattr(opts, field) != getattr(mine, field):
            raise _fail(
                ref,
                f"layout mismatch, table_options.{field}: delta {getattr(opts, field)}, table "
                f"{getattr(mine, field)}",
            )
    reader = "a replica of another layout" if by_key else None
    check_delta_rows(entry, keys, m.dims[t], what, by_key=reader)
    scores = delta_column(entry, "scores", 2, what, torch.int64, rows=n)
    num_scores = m.layout_of(t)["num_scores"]
    if scores.shape[1] != num_scores or meta["num_scores"] != num_scores:
        raise _fail(
            ref, f"the delta's scores have {scores.shape[1]} columns, the table {num_scores}"
        )
    sd = m.state_dim(t)
    if ReplayContent.OPTIMIZER_STATE in content and sd:
        state = delta_column(entry, "optimizer_states", 2, what, rows=n, optional=True)
        if state is None or state.shape[1] != sd:
            got = "none" if state is None else f"width {state.shape[1]}"
            raise _fail(
                ref,
                f"the delta holds {got} optimizer state, the table's is {sd} wide; replay without "
                "ReplayContent.OPTIMIZER_STATE to reset taken-over rows instead",
            )
    mine_keys = owned(ref, keys)
    if not by_key:
        slots = meta.get("slot_index")
        if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.shape != (n,):
            raise _fail(ref, "the delta has no (N) int64 meta['slot_index']")
        m.check_place_rows(t, keys[mine_keys], slots[mine_keys])
        if m.no_eviction:
            rows = scores[mine_keys, 0]
            cap = m.layout_of(t)["row_capacity"][0]
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= cap):
                raise _fail(ref, f"the delta's rows are not all in [0, {cap})")
    return meta.get("sequence")


def _plan(
    model: torch.nn.Module,
    deltas: dict[str, DeltaDumpResult],
    content: ReplayContent,
    by_key: bool,
) -> list[_Job]:
    if not isinstance(deltas, dict):
        raise ValueError(
            f"replay: deltas must be a dict of collection path -> DeltaDumpResult, got "
            f"{type(deltas).__name__}"
        )
    tables = model_tables(model)
    jobs: list[_Job] = []
    for coll, delta in deltas.items():
        if not isinstance(delta, DeltaDumpResult):
            raise ValueError(
                f"replay: deltas[{coll!r}] is a {type(delta).__name__}, not a DeltaDumpResult"
            )
        lengths = {c: len(getattr(delta, c)) for c in DeltaDumpResult.COLUMNS}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"replay: the delta of {coll!r} is missing per-table data: column lengths {lengths}"
            )
        try:
            folder = collection_key(coll, tables)
        except ValueError:
            warnings.warn(
                f"replay: the model has no collection {coll!r} with dynamic tables; skipping it",
                stacklevel=3,
            )
            continue
        seen = set()
        for i in range(len(delta)):
            entry = delta.table(i)
            name = entry["table_names"]
            if name in seen:
                raise ValueError(f"replay: the delta of {coll!r} holds table {name!r} twice")
            seen.add(name)
            ref = tables[folder].get(name)
            if ref is None:
                warnings.warn(
                    f"replay: collection {folder!r} has no dynamic table {name!r}; skipping it",
                    stacklevel=3,
                )
                continue
            jobs.append(_Job(ref, entry, _check_entry(ref, entry, content, by_key)))
    return jobs


def _apply(job: _Job, content: ReplayContent, by_key: bool) -> ReplayStats:
    ref, entry = job.ref, job.entry
    m, t = ref.rows, ref.index
    keys = entry["keys"]
    mine = owned(ref, keys)
    stats = ReplayStats(skipped=int((~mine).sum()))
    removals = [k for k in (entry["erased_keys"], entry["evicted_keys"]) if k is not None]
    if removals:
        gone = torch.unique(torch.cat(removals))
        gone = gone[~torch.isin(gone, keys)]
        gone = gone[owned(ref, gone)]
        stats.erased = int(m.erase_rows(t, gone).sum())
    every = bool(mine.all())

    def column(c):
        return c if every else c[mine]

    k = column(keys)
    if k.numel():
        with_state = ReplayContent.OPTIMIZER_STATE in content and m.state_dim(t) > 0
        state = column(entry["optimizer_states"]) if with_state else None
        scores = table_scores(m, t, column(entry["scores"]), ReplayContent.SCORE in content)
        values = column(entry["values"])
        if by_key:
            _, status, evicted = m.upsert_rows(t, k, scores, values, state)
            failed = status == enums.InsertStatus.FAILED
            evicted = 0 if evicted is None else int(evicted.count.reshape(-1)[0])
            stats.displaced = int(failed.sum()) + evicted
            stats.upserted = int((~failed).sum())
        else:
            slots = column(entry["meta"]["slot_index"])
            m.place_rows(t, k, slots, scores, values, state, checked=True)
            stats.upserted = k.numel()
    if job.sequence is not None and _ours(ref, entry["meta"]):
        m.delta_sequence[t] = job.sequence
        run = entry["meta"].get("run")
        if run is not None:
            old = m.delta_source[t] or {}
            same = old.get("run") == run and old.get("epoch") == entry["meta"].get("epoch")
            m.delta_source[t] = {
                "run": run,
                "epoch": entry["meta"].get("epoch", 0),
                "lineage": old.get("lineage", []) if same else [],
            }
    return stats


def _ours(ref: TableRef, meta: dict[str, Any]) -> bool:
    """Whether a delta is in this rank's chain: every rank's keys (``rank``
    None) or this rank's own."""
    rank = meta.get("rank")
    return rank is None or rank == world_of(ref)[0]


def check_follows(
    model: torch.nn.Module, deltas: dict[str, DeltaDumpResult], switch_from: int | None = None
) -> None:
    """Checks that ``deltas`` continue this rank's chain of deltas in every
    table of ``model`` they name: numbered, of this rank (or every rank), of
    the run and epoch the table follows (or ``switch_from`` -> the delta's
    epoch, a switch the caller planned), the one after the last applied.

    Raises:
        DeltaError: naming the table and what is wrong: a delta that is not
            numbered, another rank's, another run's (foreign), of another
            epoch, a duplicate or one after a gap. Nothing is changed.
    """
    tables = model_tables(model)
    for coll, delta in deltas.items():
        try:
            folder = collection_key(coll, tables)
        except ValueError:
            continue
        for name, meta in zip(delta.table_names, delta.meta):
            ref = tables[folder].get(name)
            if ref is None:
                continue
            why = _chain_error(ref, meta, switch_from)
            if why is not None:
                raise DeltaError(f"{ref.label}: {why}")


def _chain_error(ref: TableRef, meta: dict[str, Any], switch_from: int | None) -> str | None:
    if is_int(meta.get("sequence")) and not _ours(ref, meta):
        return f"delta {meta['sequence']} is rank {meta['rank']}'s, this is rank {world_of(ref)[0]}"
    m, t = ref.rows, ref.index
    return chain_error(m.delta_source[t], m.delta_sequence[t], meta, switch_from)


def _replay(model, deltas, content, by_key: bool) -> dict[str, dict[str, ReplayStats]]:
    if not isinstance(content, ReplayContent):
        raise ValueError(f"replay: content must be a ReplayContent, got {content!r}")
    if not model_tables(model):
        warnings.warn("replay: the model has no dynamic embedding tables", stacklevel=3)
        return {}
    jobs = _plan(model, deltas, content, by_key)
    out: dict[str, dict[str, ReplayStats]] = {}
    for job in jobs:
        out.setdefault(job.ref.collection, {})[job.ref.name] = _apply(job, content, by_key)
    return out


def replay_increment(
    model: torch.nn.Module,
    deltas: dict[str, DeltaDumpResult],
    content: ReplayContent = ReplayContent.ALL,
) -> dict[str, dict[str, ReplayStats]]:
    """Writes ``incremental_dump`` deltas into a model's dynamic tables, each
    key at the slot it held in the source.

    For every table, the keys the delta's ``erased_keys`` names are removed,
    then every key this rank owns (by the key, the table's ``dist_type`` and
    world size) is written at its source slot with its embedding and, per
    ``content``, its score words (ages rebased onto this table's clock) and
    optimizer state. A key that held its slot already keeps its optimizer
    state when it is not replayed; a slot taken over from another key gets
    the initial state. Without SCORE a key is scored as if this table had just
    inserted it (NO_EVICTION rows are carried either way). An evicted key
    needs no removal (the key that took its slot overwrites it), but the
    delta's ``evicted_keys`` are removed when the source retains them: that
    also covers a key evicted by one erased in the same interval, whose slot
    nobody overwrites (without them such a key stays in the replica).

    The target must be built only by replays from its source (or be empty):
    writing at a slot overwrites whatever is there.

    Args:
        model (torch.nn.Module): the model holding dynamic tables.
        deltas (Dict[str, DeltaDumpResult]): ``incremental_dump``'s result,
            by collection path. Collections and tables the model lacks are
            skipped with a warning.
        content (ReplayContent): what travels with the embedding: optimizer
            state, score words, both (the default) or neither
            (``EMBEDDING_ONLY``).

    Returns:
        Dict[str, Dict[str, ReplayStats]]: collection path -> table name ->
        what was written, removed and skipped on this rank.

    Raises:
        ValueError: a table's layout differs from the source's (capacity,
            row capacity, bucket capacity, score words, world size, score
            strategy, dim, dist_type; the first is named) or the delta lacks
            data the replay needs.
        DeltaError: a delta whose checksum is present and does not match
            its contents (corrupted, or edited without dropping it). A
            ``ValueError``.
        NotImplementedError: a table with ``dist_type="continuous"``.
        Every check runs for every table before anything is written: a
        refused replay changes nothing.

    Example::

        from dynamicemb.incremental_dump import incremental_dump, replay_increment

        # The trainer (every rank): the rows since threshold, gathered to all ranks.
        deltas = incremental_dump(model, threshold, pg=dist.group.WORLD)
        # A replica of the same layout (world size, capacity, dist_type), every rank:
        stats = replay_increment(replica, deltas)
    """
    return _replay(model, deltas, content, by_key=False)


def replay_by_key(
    model: torch.nn.Module,
    deltas: dict[str, DeltaDumpResult],
    content: ReplayContent = ReplayContent.ALL,
) -> dict[str, dict[str, ReplayStats]]:
    """Writes ``incremental_dump`` deltas into a model's dynamic tables by
    each key, in this model's own layout: any world size, capacity, bucket
    width or ``dist_type`` (``continuous`` included). Give every rank the
    whole delta (``incremental_dump(..., pg)``); each keeps the keys its own
    routing gives it.

    Removes the delta's erased and evicted keys (the source table must
    retain evictions: ``evicted_item_mode=RETAIN_KEY``; NO_EVICTION tables
    evict nothing), except keys the delta writes, then inserts or updates
    every key with its embedding and, per ``content``, score words and
    optimizer state. A full bucket evicts its lowest-scored key, as training
    would; ``ReplayStats.displaced`` counts the keys this replica could not
    keep (zero while it has room for all its source holds).

    Arguments, return value and errors as ``replay_increment``, without the
    layout comparison (dim and score strategy must still match).

    Example::

        from dynamicemb.replication import replay_by_key

        # A replica of any world size or capacity, every rank given every delta:
        stats = replay_by_key(replica, deltas)
        print(sum(s.displaced for per_table in stats.values() for s in per_table.values()))
    """
    return _replay(model, deltas, content, by_key=True)

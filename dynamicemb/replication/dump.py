"""The training side of replication: ``incremental_dump`` and the streams of
removed keys (``pop_evicted_keys``, ``pop_erased_keys``, ``erase_keys``)."""

import uuid
import warnings
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb._checks import is_int
from dynamicemb.io import Group, embeddings
from dynamicemb.io.files import chunk_rows
from dynamicemb.replication.delta import DeltaDumpResult, DeltaError, delta_checksum
from dynamicemb.replication.scores import delta_scores
from dynamicemb.replication.tables import check_routable, owned
from dynamicemb.shard.tables import TableRef, model_tables, resolve, select
from dynamicemb.table import check_keys
from dynamicemb.types import EvictedItemMode

__all__ = [
    "Dumped",
    "dump_delta",
    "erase_keys",
    "incremental_dump",
    "new_source",
    "pop_erased_keys",
    "pop_evicted_keys",
]


# Slots an incremental dump scans per chunk, at least.
DUMP_SCAN_SLOTS = 1 << 21


def _gather_keys(keys: torch.Tensor, group: Group | None) -> torch.Tensor:
    """The union over the group of 1-D key tensors (host), each key once."""
    if group is None or not group.distributed:
        return keys.cpu()
    return torch.unique(torch.cat(group.all_gather_object(keys.cpu())))


def _pop_evicted(rows, tables: list[int]) -> list[torch.Tensor | None]:
    """The evicted keys of ``tables`` (popped), None for a table whose
    ``evicted_item_mode`` is DISCARD (and those not in ``tables``)."""
    popped = rows.pop_evicted_keys(tables)
    return [
        popped[t] if t in tables and o.evicted_item_mode == EvictedItemMode.RETAIN_KEY else None
        for t, o in enumerate(rows.options)
    ]


def _with_carried(ref: TableRef, popped: torch.Tensor, carried: torch.Tensor | None):
    """The keys of a removal record with the carried ones this rank owns."""
    if carried is None or not carried.numel():
        return popped
    carried = carried[owned(ref, carried)].to(popped.device)
    return torch.unique(torch.cat([popped, carried]))


def _local_rows(ref: TableRef, threshold: int) -> dict[str, Any]:
    """One table's rows past ``threshold`` on this rank, on the host (its
    removed keys are drained later, by ``_drain``)."""
    m, t = ref.rows, ref.index
    current = m.current_score(t)
    layout = m.layout_of(t)
    sd = m.state_dim(t)
    row_bytes = m.export_row_bytes(t, slots=True)
    # Chunks bound the rows gathered at once; a threshold selects few of a
    # chunk's slots, so it scans larger ones (one count read per chunk).
    chunk = max(chunk_rows(row_bytes), DUMP_SCAN_SLOTS)
    parts = list(m.export_changed(t, chunk, threshold))
    return {
        "table_names": ref.name,
        "keys": torch.cat([p.keys for p in parts]).cpu(),
        # (n, dim) floating point, FP8 rows decoded (exact in float32).
        "values": embeddings.as_values(
            torch.cat([p.embeddings for p in parts]).cpu(), m.dims[t], m.value_dtype
        ),
        "optimizer_states": (torch.cat([p.optimizer_state for p in parts]).cpu() if sd else None),
        "scores": delta_scores(m, torch.cat([p.words for p in parts]), current).cpu(),
        "meta": dict(
            layout,
            current_score=current,
            slot_index=torch.cat([p.slots for p in parts]).cpu(),
            world_size=ref.sharding_world_size or 1,
            table_options=m.options[t],
        ),
    }


def _drain(ref: TableRef, carried: dict | None = None) -> dict[str, torch.Tensor | None]:
    """The removed keys the table recorded on this rank (drained), with
    ``carried`` ones (a failed publish's: column -> keys), less the keys back
    in the table by now (they are not removals)."""
    m, t = ref.rows, ref.index
    evicted = _pop_evicted(m, [t])[t]
    erased = m.pop_erased([t])[t]
    carried = carried or {}
    if evicted is not None:
        evicted = _with_carried(ref, evicted, carried.get("evicted_keys"))
        evicted = evicted[~m.holds(t, evicted)].cpu()
    erased = _with_carried(ref, erased, carried.get("erased_keys"))
    return {"erased_keys": erased[~m.holds(t, erased)].cpu(), "evicted_keys": evicted}


_GATHERED = ("keys", "values", "optimizer_states", "scores")
_REMOVED = ("erased_keys", "evicted_keys")


def _gathered(entries: list[dict[str, Any]], parts: list[list[dict[str, Any]]]) -> None:
    """Puts every rank's rows, slots and removed keys (``parts``: by rank,
    per table) into the entries."""
    for i, entry in enumerate(entries):
        mine = [p[i] for p in parts]
        entry["meta"] = dict(entry["meta"])
        for c in _GATHERED:
            if entry[c] is not None:
                entry[c] = torch.cat([p[c] for p in mine])
        entry["meta"]["slot_index"] = torch.cat([p["slot_index"] for p in mine])
        for c in _REMOVED:
            if entry[c] is not None:
                entry[c] = torch.unique(torch.cat([p[c] for p in mine]))


def incremental_dump(
    model: torch.nn.Module,
    score_threshold: int | dict[str, dict[str, int]],
    pg: dist.ProcessGroup | None = None,
) -> dict[str, DeltaDumpResult]:
    """Dumps the rows of dynamic tables whose score is not less than a
    threshold: what changed since the threshold was read with ``get_score``.

    Tables with a timestamp column (TIMESTAMP, or the compound
    (TIMESTAMP, LFU)) threshold the last-access timestamp, so a dump holds
    the keys touched since ``get_score`` returned the threshold; the others
    (STEP, CUSTOMIZED, LFU, NO_EVICTION) threshold the absolute score. Each
    table's ``meta["current_score"]`` is the threshold of the next dump.

    Besides the rows, a dump drains the keys the table recorded as removed
    (``evicted_keys`` for ``evicted_item_mode=RETAIN_KEY``, ``erased_keys``
    for erases recorded by ``erase_keys``), numbers the delta (the table's
    next ``meta["sequence"]``), names its source (``meta["run"]``,
    ``meta["epoch"]``, ``meta["rank"]``: see ``delta.py``) and checksums it
    (``meta["checksum"]``). With a process group, the ranks agree before
    anything is drained: on the tables, and on each table's sequence, the
    highest next one among the ranks (a rank's own dumps, ``pg=None``, may
    have advanced its tables' sequences; every rank records the agreed one).

    Args:
        model (torch.nn.Module): the model holding dynamic tables.
        score_threshold (Union[int, Dict[str, Dict[str, int]]]): one
            threshold for every table, or collection -> table name ->
            threshold for the tables named only (a None threshold, what
            ``get_score`` gives a table in an external storage, leaves the
            table out).
        pg (Optional[dist.ProcessGroup]): when given, every rank of the group
            gets the rows of all ranks (all-gather); None: each rank's own.

    Returns:
        Dict[str, DeltaDumpResult]: collection path -> its delta ({} with a
        warning when the model has no dynamic tables).

    Raises:
        ValueError: a bad threshold, an unknown collection or table.
        NotImplementedError: a table with ``dist_type="continuous"``.
        DeltaError: the ranks of ``pg`` name different tables.
        Nothing is dumped or drained when one of these is raised; with a
        process group, every rank raises the same error (the first failing
        rank's, naming it).

    Example::

        from dynamicemb.incremental_dump import get_score, incremental_dump

        threshold = get_score(model)  # every rank, before the steps to capture
        for batch in batches:
            train_step(model, batch)
        deltas = incremental_dump(model, threshold)  # every rank: its rows since
        threshold = {  # the next dump's
            path: {name: meta["current_score"] for name, meta in zip(d.table_names, d.meta)}
            for path, d in deltas.items()
        }
    """
    dumped = dump_delta(model, score_threshold, pg)
    if dumped is None:
        warnings.warn("incremental_dump: the model has no dynamic embedding tables", stacklevel=2)
        return {}
    dumped.commit()
    return dumped.deltas


class Dumped:
    """A dump's deltas, not yet recorded in the tables: ``commit`` sets each
    table's delta sequence and source to the dump's (a stream commits once
    the delta is published; until then the tables are as before)."""

    def __init__(self, deltas: dict[str, DeltaDumpResult], tables: list) -> None:
        self.deltas = deltas
        self._tables = tables  # (ref, sequence, source)

    def commit(self) -> None:
        for ref, seq, source in self._tables:
            ref.rows.delta_sequence[ref.index] = seq
            ref.rows.delta_source[ref.index] = source


def new_source() -> dict[str, Any]:
    """The source of a run's first delta: a new run id, epoch 0."""
    return {"run": uuid.uuid4().hex, "epoch": 0, "lineage": []}


def dump_delta(
    model: torch.nn.Module,
    score_threshold: int | dict[str, dict[str, int]],
    pg: dist.ProcessGroup | None = None,
    sequence: int | None = None,
    source: dict[str, Any] | None = None,
    carried: dict[tuple[str, str], dict] | None = None,
) -> Dumped | None:
    """``incremental_dump`` without recording the sequence in the tables
    (None: no dynamic table). ``sequence`` and ``source`` number every table
    alike (default: each table's next, its own source); ``carried``:
    (collection, table) -> removed keys of a failed publish, merged into the
    delta's ``erased_keys`` / ``evicted_keys``. The removed-key records are
    drained either way."""
    tables = model_tables(model)
    group = Group(pg, DeltaError) if pg is not None else None
    gathered = group is not None and group.distributed
    chosen, error = [], None
    try:
        chosen = _chosen(tables, score_threshold)
    except Exception as e:  # refused on every rank alike
        if not gathered:
            raise
        error = e
    if gathered:
        # The ranks agree before anything is drained: on the tables, on each
        # table's sequence (the highest next one: a rank's own dumps may have
        # advanced it) and on its source (rank 0's where a table has none).
        names = [(ref.collection, ref.name) for ref, _ in chosen]
        facts = group.verdict(error, (names, [_next_sequence(ref) for ref, _ in chosen]))
        if any(f[0] != names for f in facts):
            raise DeltaError(
                "incremental_dump: the ranks of the group name different tables "
                f"{[f[0] for f in facts]}: every rank of the group must dump the same tables"
            )
        next_sequences = [max(f[1][i] for f in facts) for i in range(len(names))]
    else:
        next_sequences = [_next_sequence(ref) for ref, _ in chosen]
    if not tables:
        return None
    sequences = next_sequences if sequence is None else [sequence] * len(chosen)
    fresh = new_source()  # one run for the tables of this dump that have none
    sources = [source or ref.rows.delta_source[ref.index] or fresh for ref, _ in chosen]
    entries, error = [], None
    try:
        entries = [_local_rows(ref, threshold) for ref, threshold in chosen]
    except Exception as e:  # reported to every rank before anything is drained
        if not gathered:
            raise
        error = e
    if gathered:
        sources = group.verdict(error, sources)[0]
    carried = carried or {}
    for (ref, _), entry in zip(chosen, entries):
        entry.update(_drain(ref, carried.get((ref.collection, ref.name))))
    if gathered:
        parts = group.all_gather_object(
            [
                {c: e[c] for c in _GATHERED + _REMOVED} | {"slot_index": e["meta"]["slot_index"]}
                for e in entries
            ]
        )
        _gathered(entries, parts)
    out: dict[str, DeltaDumpResult] = {}
    for (ref, _), entry, seq, src in zip(chosen, entries, sequences, sources):
        world = ref.sharding_world_size or 1
        entry["meta"].update(
            sequence=seq,
            run=src["run"],
            epoch=src["epoch"],
            # None: the delta holds every rank's keys.
            rank=None if gathered or world == 1 else (ref.sharding_rank or 0),
        )
        entry["meta"]["checksum"] = delta_checksum(entry)
        out.setdefault(ref.collection, DeltaDumpResult()).append(entry)
    return Dumped(out, [(ref, seq, src) for (ref, _), seq, src in zip(chosen, sequences, sources)])


def _chosen(tables, score_threshold) -> list[tuple[TableRef, int]]:
    """The (table, threshold) pairs of a dump, checked.

    Raises:
        ValueError: a bad threshold, an unknown collection or table.
        NotImplementedError: a continuous or external-storage table.
    """
    if not (is_int(score_threshold) or isinstance(score_threshold, dict)):
        raise ValueError(
            "incremental_dump: score_threshold must be an int or a dict of collection -> "
            f"{{table name: int}}, got {score_threshold!r}"
        )
    if is_int(score_threshold):
        chosen = [(ref, score_threshold) for refs in tables.values() for ref in refs.values()]
    else:
        chosen = resolve(tables, score_threshold, "incremental_dump") if tables else []
        # None: get_score's threshold of a table it cannot score (external storage).
        chosen = [(ref, value) for ref, value in chosen if value is not None]
        for ref, value in chosen:
            if not is_int(value):
                raise ValueError(
                    f"incremental_dump: the threshold of {ref.label} must be an int, got {value!r}"
                )
    for ref, _ in chosen:
        check_routable(ref, "incremental_dump")
        ref.rows.check_delta("incremental_dump")  # raises for an external storage
    return chosen


def _next_sequence(ref: TableRef) -> int:
    return (ref.rows.delta_sequence[ref.index] or 0) + 1


def _selected(model, table_names, what: str) -> list[TableRef]:
    tables = model_tables(model)
    if table_names is not None and not isinstance(table_names, dict):
        raise ValueError(
            f"{what}: table_names must be a dict of collection -> [table name, ...], got "
            f"{type(table_names).__name__}"
        )
    return select(tables, table_names)


def _pop(model, table_names, pg, what: str, evicted: bool) -> dict[str, dict[str, torch.Tensor]]:
    refs = _selected(model, table_names, what)
    group = Group(pg) if pg is not None else None
    by_module: dict[int, list[TableRef]] = {}
    for ref in refs:
        by_module.setdefault(id(ref.rows), []).append(ref)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for chosen in by_module.values():
        m = chosen[0].rows
        idx = [r.index for r in chosen]
        popped = _pop_evicted(m, idx) if evicted else m.pop_erased(idx)
        for ref in chosen:
            keys = popped[ref.index]
            if keys is None:
                continue
            out.setdefault(ref.collection, {})[ref.name] = _gather_keys(keys, group)
    return out


def pop_evicted_keys(
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | None = None,
    pg: dist.ProcessGroup | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """Returns and clears the keys evicted since the last call (or the last
    ``incremental_dump``, which drains the same record), per table, each key
    once. Only tables with ``evicted_item_mode=RETAIN_KEY`` are included.

    Args:
        model (torch.nn.Module): the model holding dynamic tables.
        table_names (Optional[Dict[str, List[str]]]): collection -> tables to
            pop; None: every table.
        pg (Optional[dist.ProcessGroup]): None: this rank's keys; given: the
            union over the group. Only this rank's record is cleared.

    Returns:
        Dict[str, Dict[str, torch.Tensor]]: collection path -> table name ->
        (n) int64 host tensor of keys.
    """
    return _pop(model, table_names, pg, "pop_evicted_keys", evicted=True)


def pop_erased_keys(
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | None = None,
    pg: dist.ProcessGroup | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """Returns and clears the keys erases recorded (``erase_keys`` with
    ``RETAIN_KEY``) since the last call (or the last ``incremental_dump``),
    per table, each key once. Every table is included (whether an erase is
    recorded is each erase's choice, not the table's). Arguments as
    ``pop_evicted_keys``."""
    return _pop(model, table_names, pg, "pop_erased_keys", evicted=False)


def erase_keys(
    model: torch.nn.Module,
    keys: dict[str, dict[str, torch.Tensor]],
    evicted_item_mode: EvictedItemMode = EvictedItemMode.RETAIN_KEY,
) -> dict[str, dict[str, int]]:
    """Removes keys from dynamic tables. Each rank removes the keys it holds
    (pass the same keys on every rank, or each rank's own).

    Args:
        model (torch.nn.Module): the model holding dynamic tables.
        keys (Dict[str, Dict[str, torch.Tensor]]): collection -> table name ->
            int64 keys.
        evicted_item_mode (EvictedItemMode): RETAIN_KEY (the default) records
            the keys removed, for ``pop_erased_keys`` and the next
            ``incremental_dump`` (whose replays remove them too); DISCARD
            records nothing.

    Returns:
        Dict[str, Dict[str, int]]: collection path -> table name -> keys
        removed on this rank.

    Raises:
        ValueError: an unknown collection or table, keys that are not a 1-D
            int64 tensor, or a reserved key value; nothing is removed then.
    """
    mode = EvictedItemMode(evicted_item_mode)
    chosen = resolve(model_tables(model), keys, "erase_keys")
    for ref, k in chosen:
        if not isinstance(k, torch.Tensor) or k.dtype != torch.int64 or k.dim() != 1:
            raise ValueError(
                f"erase_keys: the keys of {ref.label} must be a 1-D int64 tensor, got "
                f"{getattr(k, 'dtype', type(k).__name__)} {tuple(getattr(k, 'shape', ()))}"
            )
        check_keys(k, f"erase_keys: {ref.label}")
    out: dict[str, dict[str, int]] = {}
    for ref, k in chosen:
        removed = ref.rows.erase_rows(ref.index, k, record=mode == EvictedItemMode.RETAIN_KEY)
        out.setdefault(ref.collection, {})[ref.name] = int(removed.sum())
    return out

"""DynamicEmbLoad: read, verify, reshard, then replace the tables' contents.

A load runs in three steps, each agreed on by all ranks before the next:

1. Plan: read the manifest and the meta JSON of every selected table, and
   check them against the model (collection and table present, dim,
   optimizer, score columns) and the files against their recorded sizes.
2. Read: the shards (one dumping rank's files of a table) are divided among
   the loading ranks by size; each rank reads its shards in chunks,
   verifying every block's CRC-32 before using it, sends each row to the
   rank that owns its key now (``route_keys`` with the table's current
   ``dist_type`` and world size) and keeps the rows it receives.
   A table's admission counter entries (the counter files) are read the
   same way and go to the rank that owns their key.
3. Apply: each rank snapshots the modules it changes, empties the loaded
   tables and inserts the rows, highest score first and without eviction, so
   that a table that is now smaller keeps, per bucket, the keys its eviction
   would keep; the others are reported as dropped. The loaded tables'
   admission counters are emptied and given the checkpoint's entries
   (``Counter.erase`` and ``Counter.load``). If any rank fails, every rank
   restores its snapshot (rows and counters; a counter whose ``load`` fails
   gets its entries back through ``erase`` and ``add``).

Admission counters and checkpoints of other kinds: a checkpoint without
counter files (dumped without admission, or legacy) loads into a table with
admission with its counter emptied, and a warning; counter files loaded into
a table without admission (a serving model, say) are ignored with a warning.

Nothing is changed before step 3, and step 3 undoes itself on failure: a
load that fails leaves the model as it was.
"""

import logging
import os
import sys
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dynamicemb.admission.counters import (
    COUNT_DTYPE,
    check_counter_entries,
    counter_entries,
    replace_counter_entries,
    restore_counter_entries,
)
from dynamicemb.checkpoint import files
from dynamicemb.checkpoint.dump import group_of, tables_of
from dynamicemb.checkpoint.layout import (
    CHECKSUM_BLOCK_BYTES,
    COUNTER_KEYS,
    COUNTER_VALUES,
    KEYS,
    OPT_VALUES,
    SCORES,
    VALUES,
    CheckpointError,
    FileInfo,
    Shard,
    TableMeta,
    legacy_file,
)
from dynamicemb.checkpoint.read import (
    check_shard_sizes,
    check_table_keys,
    read_shard,
    table_meta,
)
from dynamicemb.dynamicemb_config import DynamicEmbScoreStrategy
from dynamicemb.io import Group, embeddings, fs
from dynamicemb.io import files as io_files
from dynamicemb.io.files import IO_THREADS, chunk_rows
from dynamicemb.shard.routing import route_keys
from dynamicemb.shard.tables import TableRef, synchronize

log = logging.getLogger("dynamicemb.checkpoint")


@dataclass
class TableLoad:
    """One table's load over all ranks: rows in the checkpoint, rows the
    table holds now, rows that did not fit."""

    collection: str
    table: str
    checkpoint_rows: int
    loaded: int
    dropped: int


@dataclass
class LoadReport:
    path: str
    tables: list[TableLoad] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0


@dataclass
class _Plan:
    ref: TableRef
    meta: TableMeta
    folder: str
    with_state: bool  # the optimizer state is loaded
    optim: bool
    # The table's admission counter: LOAD_COUNTER (files into a counter),
    # CLEAR_COUNTER (no files: emptied), IGNORE_COUNTER (files, no counter);
    # None: neither has one.
    counter: str | None = None

    @property
    def what(self) -> str:
        return self.ref.label


# ---------------------------------------------------------------- plan --

LOAD_COUNTER, CLEAR_COUNTER, IGNORE_COUNTER = "load", "clear", "ignore"


def _legacy_meta(folder: str, ref: TableRef) -> TableMeta:
    """A table of the legacy layout: float32 rows whose width (embedding, or
    embedding and optimizer state) follows from the file sizes."""
    what = f"{ref.label} (legacy layout)"
    paths = {k: os.path.join(folder, legacy_file(ref.name, k)) for k in (KEYS, VALUES, SCORES)}
    for k in (KEYS, VALUES):
        if not os.path.isfile(paths[k]):
            raise CheckpointError(f"{what}: {paths[k]} does not exist")
    key_bytes = os.path.getsize(paths[KEYS])
    value_bytes = os.path.getsize(paths[VALUES])
    if key_bytes % 8:
        raise CheckpointError(f"{what}: {paths[KEYS]} has {key_bytes} bytes, not whole int64 keys")
    n = key_bytes // 8
    dim = ref.dim
    widths = [dim + w for w in ref.rows.state_widths(ref.index) if w]
    width = dim if n == 0 else value_bytes // (4 * n)
    if n and value_bytes != 4 * n * width or width not in (dim, *widths):
        raise CheckpointError(
            f"{what}: {paths[VALUES]} holds {value_bytes} bytes for {n} keys, not float32 rows of "
            f"the table's dim {dim}"
            + (f" or dim + optimizer state {' or '.join(map(str, widths))}" if widths else "")
        )
    files_ = {
        KEYS: FileInfo(legacy_file(ref.name, KEYS), key_bytes, None),
        VALUES: FileInfo(legacy_file(ref.name, VALUES), value_bytes, None),
    }
    strategy: list[str] = []
    if os.path.isfile(paths[SCORES]) and ref.rows.num_scores == 1:
        cols = ref.rows.score_columns()
        if cols is not None and os.path.getsize(paths[SCORES]) == 8 * n:
            files_[SCORES] = FileInfo(legacy_file(ref.name, SCORES), 8 * n, None)
            strategy = [ref.rows.strategies[0].name]
    return TableMeta(
        table_name=ref.name,
        embedding_dtype=torch.float32,
        embedding_dim=dim,
        optim_state_dtype=torch.float32 if width > dim else None,
        optim_state_dim=width - dim,
        optimizer=None,
        score_strategy=strategy,
        step=0,
        dist_type=ref.dist_type,
        num_embeddings=ref.num_embeddings,
        world_size=1,
        shards=[Shard(0, n, files_)],
        checksum_block_bytes=CHECKSUM_BLOCK_BYTES,
        legacy=True,
    )


def check_meta(meta: TableMeta, ref: TableRef, optim: bool) -> bool:
    """Checks a table's meta against the table; returns whether its
    optimizer state is to be loaded.

    Raises:
        ValueError: dim, score columns or optimizer differ (with ``optim``,
            also a checkpoint with optimizer state for a table whose
            optimizer keeps none).
    """
    rows, t = ref.rows, ref.index
    if meta.embedding_dim != ref.dim:
        raise ValueError(
            f"{ref.label}: the checkpoint's embedding_dim {meta.embedding_dim} differs from the "
            f"table's dim {ref.dim}"
        )
    cols = rows.score_columns()
    names = [s.name for s in rows.strategies]
    if cols is not None and meta.num_scores and meta.score_strategy != names:
        raise ValueError(
            f"{ref.label}: the checkpoint's score columns {meta.score_strategy} differ from the "
            f"table's score_strategy {names}"
        )
    with_state = optim and rows.state_dim(t) > 0
    if optim and not rows.training_state:
        raise ValueError(f"{ref.label}: optim=True, but the table keeps no optimizer state")
    if optim and meta.optimizer is not None and meta.optimizer != rows.optimizer_name:
        raise ValueError(
            f"{ref.label}: optim=True, but the checkpoint's optimizer state is "
            f"{meta.optimizer}'s (optim_state_dim {meta.optim_state_dim}) and the table uses "
            f"{rows.optimizer_name} ({rows.state_dim(t)}); load with optim=False to take the "
            "embeddings and scores alone"
        )
    if optim and not with_state and meta.optim_state_dim:
        raise ValueError(
            f"{ref.label}: optim=True, but the checkpoint holds optimizer state "
            f"(optim_state_dim {meta.optim_state_dim}) and the table's optimizer "
            f"{rows.optimizer_name} keeps none; load with optim=False to take the embeddings "
            "and scores alone"
        )
    if with_state:
        if not meta.optim_state_dim:
            raise ValueError(
                f"{ref.label}: optim=True, but the checkpoint holds no optimizer state (it was "
                "dumped with optim=False)"
            )
        if meta.optimizer is not None and meta.optimizer != rows.optimizer_name:
            raise ValueError(
                f"{ref.label}: the checkpoint's optimizer state is {meta.optimizer}'s, the table "
                f"uses {rows.optimizer_name}"
            )
        # Rowwise Adagrad's state was written whole (16 bytes) before
        # checkpoints narrowed it to its one scalar: both load.
        if meta.optim_state_dim not in rows.state_widths(t):
            raise ValueError(
                f"{ref.label}: the checkpoint's optim_state_dim {meta.optim_state_dim} differs "
                f"from the table's {rows.state_dim(t)}"
            )
    return with_state


def _plan(root: fs.Location, manifest: dict | None, ref: TableRef, optim: bool) -> _Plan:
    folder = root.join(ref.collection)
    if manifest is None:
        if not os.path.isdir(folder):
            raise CheckpointError(
                f"{ref.label}: {root} is not a dynamicemb checkpoint (no manifest) and has no "
                f"folder {ref.collection!r}"
            )
        meta = _legacy_meta(folder, ref)
    else:
        folder, meta = table_meta(root, manifest, ref.collection, ref.name, ref.label)
    with_state = check_meta(meta, ref, optim)
    check_shard_sizes(folder, meta, _kinds(meta), ref.label, _columns)
    has_files = meta.admission_counter is not None
    counter = {
        (True, True): LOAD_COUNTER,
        (False, True): CLEAR_COUNTER,
        (True, False): IGNORE_COUNTER,
    }.get((has_files, ref.rows.admission_counter() is not None))
    if counter == LOAD_COUNTER:
        for shard in meta.shards:
            _counter_entries(meta, shard, ref.label)
    return _Plan(ref, meta, folder, with_state, optim, counter)


def _counter_entries(meta: TableMeta, shard: Shard, what: str) -> int:
    """The entries of a shard's counter files, from their sizes."""
    keys, counts = shard.files[COUNTER_KEYS], shard.files[COUNTER_VALUES]
    item = meta.counter_key_dtype().itemsize
    n = keys.nbytes // item
    if keys.nbytes % item or counts.nbytes != n * COUNT_DTYPE.itemsize:
        raise CheckpointError(
            f"{what}: the meta JSON records {keys.nbytes} bytes for {keys.name} and "
            f"{counts.nbytes} for {counts.name}, not equally many {meta.counter_key_dtype()} "
            "keys and int64 counts"
        )
    return n


def _columns(meta: TableMeta, kind: str) -> tuple[torch.dtype, int]:
    if meta.legacy and kind == VALUES:  # embedding and state in one file
        return torch.float32, meta.embedding_dim + meta.optim_state_dim
    return meta.columns(kind)


def _kinds(meta: TableMeta) -> list[str]:
    if meta.legacy:
        return [k for k in meta.kinds() if k != OPT_VALUES]
    return meta.kinds()


# ---------------------------------------------------------------- read --


def _assign(shards: list[Shard], world: int) -> list[list[Shard]]:
    """Shards per loading rank, balanced by bytes (the same on every rank)."""
    loads = [0] * world
    out: list[list[Shard]] = [[] for _ in range(world)]
    for s in sorted(shards, key=lambda s: (-s.nbytes, s.rank)):
        r = loads.index(min(loads))
        out[r].append(s)
        loads[r] += s.nbytes
    return out


def _read_shard(plan: _Plan, shard: Shard, pool, progress) -> dict[str, torch.Tensor]:
    return read_shard(
        plan.folder, plan.meta, shard, _kinds(plan.meta), plan.what, pool, progress, _columns
    )


def _chunks(plan: _Plan, shards: list[Shard], rows: int, pool, progress):
    for shard in shards:
        parts = _read_shard(plan, shard, pool, progress)
        for lo in range(0, shard.rows, rows):
            yield {k: v[lo : lo + rows] for k, v in parts.items()}


def _pack(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([parts[k].contiguous().view(torch.uint8) for k in sorted(parts)], dim=1)


def _unpack(meta: TableMeta, data: torch.Tensor) -> dict[str, torch.Tensor]:
    out, col = {}, 0
    for k in sorted(_kinds(meta)):
        dtype, ncols = _columns(meta, k)
        width = ncols * dtype.itemsize
        if data.shape[0] == 0:  # an empty slice keeps the packed row's stride
            out[k] = torch.empty(0, ncols, dtype=dtype, device=data.device)
        else:
            out[k] = data[:, col : col + width].contiguous().view(dtype)
        col += width
    return out


def _read(plan: _Plan, group: Group, pool, progress) -> dict[str, torch.Tensor]:
    """This rank's rows of a table after the exchange, as column blocks."""
    meta = plan.meta
    mine = _assign(meta.shards, group.world_size)[group.rank]
    row_bytes = sum(c * d.itemsize for d, c in (_columns(meta, k) for k in _kinds(meta)))
    rows = chunk_rows(row_bytes)
    if not group.distributed:  # no exchange: whole shards
        rows = max([s.rows for s in mine] + [1])
    local = sum(-(-s.rows // rows) for s in mine)
    (rounds,) = group.all_reduce([local], op="max")
    chunks = _chunks(plan, mine, rows, pool, progress)
    kept: list[dict[str, torch.Tensor]] = []
    for _ in range(rounds):
        error, parts, dest = None, None, None
        try:
            parts = next(chunks, None)
            if group.distributed:
                if parts is None:
                    parts = {
                        k: torch.empty(0, c, dtype=d)
                        for k, (d, c) in ((k, _columns(meta, k)) for k in _kinds(meta))
                    }
                dest = route_keys(
                    parts[KEYS].reshape(-1),
                    group.world_size,
                    plan.ref.dist_type,
                    plan.ref.num_embeddings,
                )
        except BaseException as e:
            error = e
        group.agree(error)
        if group.distributed:
            parts = _unpack(meta, group.exchange(_pack(parts), dest))
        if parts is not None:
            kept.append(parts)
    if next(chunks, None) is not None:  # pragma: no cover - rounds count every chunk
        raise CheckpointError(f"{plan.what}: rows left unread")
    if len(kept) == 1:
        return kept[0]
    return {
        k: torch.cat([p[k] for p in kept]) if kept else torch.empty(0, c, dtype=d)
        for k, (d, c) in ((k, _columns(meta, k)) for k in _kinds(meta))
    }


def _read_counter(plan: _Plan, group: Group, pool, progress):
    """This rank's admission counter entries of a table after the exchange:
    (keys, counts), both (c) int64; None unless the plan loads a counter."""
    if plan.counter != LOAD_COUNTER:
        return None
    meta = plan.meta
    error, keys, counts, dest = None, [], [], None
    try:
        for shard in _assign(meta.shards, group.world_size)[group.rank]:
            n = _counter_entries(meta, shard, plan.what)
            k = torch.empty(n, dtype=meta.counter_key_dtype())
            c = torch.empty(n, dtype=COUNT_DTYPE)
            tasks = [
                lambda info=shard.files[kind], out=out: (
                    io_files.read_verified(
                        plan.folder,
                        info,
                        meta.checksum_block_bytes,
                        plan.what,
                        out,
                        CheckpointError,
                    ),
                    progress.update(info.nbytes),
                )
                for kind, out in ((COUNTER_KEYS, k), (COUNTER_VALUES, c))
            ]
            io_files.run_tasks(tasks, pool)
            keys.append(k.to(torch.int64))
            counts.append(c)
        keys = torch.cat(keys) if keys else torch.empty(0, dtype=torch.int64)
        counts = torch.cat(counts) if counts else torch.empty(0, dtype=COUNT_DTYPE)
        try:
            check_counter_entries(keys, counts, f"{plan.what}: admission counter")
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        if group.distributed:
            dest = route_keys(keys, group.world_size, plan.ref.dist_type, plan.ref.num_embeddings)
    except BaseException as e:
        error = e
    group.agree(error)
    if group.distributed:
        packed = torch.stack([keys, counts], dim=1).contiguous().view(torch.uint8)
        got = group.exchange(packed, dest).view(torch.int64)
        keys, counts = got[:, 0].contiguous(), got[:, 1].contiguous()
    return keys, counts


# --------------------------------------------------------------- apply --


def _order(plan: _Plan, scores: torch.Tensor | None) -> torch.Tensor | None:
    """Rows best first (the keys eviction would keep: ``TableRows.keep_order``),
    None: as they are."""
    if scores is None or scores.shape[0] < 2:
        return None
    return plan.ref.rows.keep_order(scores)


def _apply(plan: _Plan, rows: dict[str, torch.Tensor], chunk: int) -> tuple[int, int]:
    """Replaces the table's keys with ``rows``; returns (stored, dropped)."""
    rows_, t, meta = plan.ref.rows, plan.ref.index, plan.meta
    keys = rows[KEYS].reshape(-1)
    emb = rows[VALUES]
    state = rows.get(OPT_VALUES)
    if meta.legacy:
        emb, state = emb[:, : meta.embedding_dim], emb[:, meta.embedding_dim :]
        if not state.shape[1]:
            state = None
    if not plan.with_state:
        state = None
    # Another precision: decoded and encoded at the table's (warned in load).
    emb = embeddings.convert(emb, meta.embedding_dim, meta.embedding_dtype, rows_.value_dtype)
    scores = rows.get(SCORES)
    if rows_.score_columns() is not None and scores is None:
        scores = torch.zeros(keys.numel(), rows_.num_scores, dtype=torch.int64)
    evicting = rows_.score_columns() is not None

    def insert(order):
        rows_.clear_tables([t])
        rows_.reserve_rows(t, keys.numel())
        stored = 0
        for lo in range(0, keys.numel(), chunk):
            idx = slice(lo, lo + chunk) if order is None else order[lo : lo + chunk]
            ok = rows_.import_rows(
                t,
                keys[idx],
                scores[idx] if evicting else None,
                emb[idx],
                None if state is None else state[idx],
            )
            stored += int(ok.sum())
        return stored

    # In file order first; a table too small for all keys (some bucket
    # overflowed) is filled again best first, so that it keeps what its
    # eviction would keep.
    stored = insert(None)
    if stored < keys.numel() and evicting:
        stored = insert(_order(plan, scores))
    return stored, keys.numel() - stored


def _sets_step(plan: _Plan) -> bool:
    return plan.optim or DynamicEmbScoreStrategy.STEP in plan.ref.rows.strategies


def apply_all(
    plans: list[_Plan],
    received: list[dict[str, torch.Tensor]],
    group: Group,
    counters: list | None = None,
):
    """Step 3: every plan's rows into its table (and ``counters``, what
    ``_read_counter`` returned per plan, into its admission counter), on
    every rank or on none. Returns (stored, dropped) per plan."""
    synchronize([p.ref for p in plans])
    counters = counters or [None] * len(plans)
    tables = {id(p.ref.rows): p.ref.rows for p in plans}
    snapshots, results, error = {}, [], None
    counted = [p for p in plans if p.counter in (LOAD_COUNTER, CLEAR_COUNTER)]
    counter_snapshots: list[tuple] = []
    try:
        for p in counted:
            counter = p.ref.rows.admission_counter()
            counter_snapshots.append((counter, p.ref.index, *counter_entries(counter, p.ref.index)))
        for key, rows in tables.items():
            snapshots[key] = rows.snapshot()
        for p, rows in zip(plans, received):
            row_bytes = p.ref.rows.export_row_bytes(p.ref.index, p.with_state)
            results.append(_apply(p, rows, chunk_rows(row_bytes)))
        for p, entries in zip(plans, counters):
            if p.counter in (LOAD_COUNTER, CLEAR_COUNTER):
                empty = torch.empty(0, dtype=torch.int64)
                keys, counts = entries if entries is not None else (empty, empty)
                replace_counter_entries(p.ref.rows.admission_counter(), p.ref.index, keys, counts)
        steps = defaultdict(list)
        for p in plans:
            if _sets_step(p):
                steps[id(p.ref.rows)].append(p.meta.step)
            # The deltas that follow this checkpoint continue from its sequence.
            p.ref.rows.delta_sequence[p.ref.index] = p.meta.delta_sequence
            p.ref.rows.delta_source[p.ref.index] = p.meta.delta_source
        for key, rows in tables.items():
            if steps[key]:
                rows.step = max(steps[key])
    except BaseException as e:
        error = e
    try:
        group.agree(error)
    except BaseException:
        for key, rows in tables.items():
            if key in snapshots:
                rows.restore(snapshots[key])
        # Every counter is restored, even after one fails to (the load's own
        # error is the one raised; a counter left partial is logged).
        for counter, t, keys, counts in counter_snapshots:
            try:
                restore_counter_entries(counter, t, keys, counts)
            except Exception as e:
                log.error(
                    "DynamicEmbLoad: table %d of %s: the admission counter could not be "
                    "restored after the failed load (%r)",
                    t,
                    type(counter).__name__,
                    e,
                )
        raise
    return results


def load(
    path: str,
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | list[str] | None = None,
    optim: bool = False,
    pg: dist.ProcessGroup | None = None,
    show_progress: bool = True,
) -> LoadReport | None:
    """``DynamicEmbLoad``, returning what was loaded (None: no dynamic table)."""
    group = group_of(pg, "DynamicEmbLoad")
    refs = tables_of(model, table_names, group, "DynamicEmbLoad")
    if refs is None:
        return None
    # 1. plan
    plans: list[_Plan] = []
    error = None
    try:
        path = fs.at(path)  # the one resolution of the path to its filesystem
        root, manifest = files.resolve(path)
        plans = [_plan(root, manifest, ref, optim) for ref in refs]
    except BaseException as e:
        error = e
    group.agree(error)
    for p in plans:
        if p.meta.embedding_dtype != p.ref.rows.value_dtype:
            warnings.warn(
                f"DynamicEmbLoad: {p.what}: the checkpoint's values are "
                f"{p.meta.embedding_dtype}, the table stores {p.ref.rows.value_dtype}; "
                "converting",
                stacklevel=3,
            )
    # 2. read, verify, reshard
    mine = sum(
        s.nbytes for p in plans for s in _assign(p.meta.shards, group.world_size)[group.rank]
    )
    progress = io_files.Progress("DynamicEmbLoad", mine, show_progress and group.rank == 0)
    for p in plans:
        if p.counter == IGNORE_COUNTER:
            warnings.warn(
                f"DynamicEmbLoad: {p.what}: the checkpoint holds an admission counter "
                f"({p.meta.admission_counter.get('entries')} keys waiting to be admitted), the "
                "table has no admission strategy that counts; ignoring the counter",
                stacklevel=3,
            )
        elif p.counter == CLEAR_COUNTER:
            warnings.warn(
                f"DynamicEmbLoad: {p.what}: the checkpoint holds no admission counter; the "
                "table's counter starts empty",
                stacklevel=3,
            )
    with ThreadPoolExecutor(IO_THREADS) as pool:
        received = [_read(p, group, pool, progress) for p in plans]
        counters = [_read_counter(p, group, pool, progress) for p in plans]
    error = None
    try:
        for p, rows in zip(plans, received):
            check_table_keys(rows[KEYS], p.what)
    except BaseException as e:
        error = e
    group.agree(error)
    # 3. apply, all or nothing
    results = apply_all(plans, received, group, counters)
    seconds = progress.close()
    totals = group.all_reduce([v for r in results for v in r] + [mine])
    report = LoadReport(path.fs.absolute(path), nbytes=totals[-1], seconds=seconds)
    for i, p in enumerate(plans):
        report.tables.append(
            TableLoad(p.ref.collection, p.ref.name, p.meta.rows, totals[2 * i], totals[2 * i + 1])
        )
    if group.rank == 0:
        for tl in report.tables:
            if tl.dropped:
                warnings.warn(
                    f"DynamicEmbLoad: table {tl.table!r} of {tl.collection!r}: {tl.dropped} of "
                    f"{tl.checkpoint_rows} keys did not fit (its buckets kept their "
                    "highest-scored keys)",
                    stacklevel=3,
                )
        line = (
            f"DynamicEmbLoad: {len(plans)} tables, {sum(t.loaded for t in report.tables)} rows, "
            f"{report.nbytes / 2**20:.1f} MiB (all ranks) in {seconds:.2f} s from {report.path}"
        )
        log.info(line)
        if progress.bar is not None:
            print(line, file=sys.stderr)
    return report

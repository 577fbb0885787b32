"""DynamicEmbDump: every rank writes the rows it holds, rank 0 publishes."""

import logging
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.admission.counters import COUNT_DTYPE, counter_key_type
from dynamicemb.checkpoint import files
from dynamicemb.checkpoint.layout import (
    COUNTER_KEYS,
    COUNTER_VALUES,
    FORMAT_NAME,
    FORMAT_VERSION,
    KEYS,
    MANIFEST,
    OPT_VALUES,
    SCORES,
    VALUES,
    CheckpointError,
    Shard,
    TableMeta,
    meta_file,
    shard_file,
)
from dynamicemb.io import Group, dtypes, fs
from dynamicemb.io import files as io_files
from dynamicemb.io.files import CHECKSUM_BLOCK_BYTES, IO_THREADS, chunk_rows, host_bytes
from dynamicemb.shard.tables import TableRef, model_tables, select, synchronize

log = logging.getLogger("dynamicemb.checkpoint")


@dataclass
class DumpReport:
    """What a dump wrote: tables, rows and bytes over all ranks, seconds."""

    path: str
    tables: int
    rows: int
    nbytes: int
    seconds: float


def group_of(pg: dist.ProcessGroup | None, call: str) -> Group:
    """The ranks of a dump or load (their agreed failures: ``CheckpointError``),
    met at the start of ``call`` (``Group.meet``: a call made on some ranks
    only raises naming it instead of waiting forever)."""
    group = Group(pg, CheckpointError)
    group.meet(call)
    return group


def counter_description(ref: TableRef, entries: int) -> dict[str, Any]:
    """The meta JSON's ``admission_counter`` of a table: the counter's class
    and file dtypes, ``entries`` over all ranks, and the threshold and
    counter share of its strategy where it has them."""
    counter = ref.rows.admission_counter()
    assert counter is not None
    strategy = ref.options.admit_strategy
    out: dict[str, Any] = {
        "counter": type(counter).__name__,
        "key_dtype": dtypes.key_dtype_name(counter_key_type(counter)),
        "count_dtype": dtypes.key_dtype_name(COUNT_DTYPE),
        "entries": int(entries),
        "strategy": type(strategy).__name__,
    }
    if isinstance(getattr(strategy, "threshold", None), int):
        out["threshold"] = strategy.threshold
    share = getattr(strategy, "kv_counter", None)
    if share is not None:
        out["capacity"] = int(share.capacity)
        out["bucket_capacity"] = int(share.bucket_capacity)
    return out


def _write_table(
    folder: fs.Location, ref: TableRef, optim: bool, rank: int, world: int, pool, progress
) -> Shard:
    rows_, t = ref.rows, ref.index
    sd = rows_.state_dim(t) if optim else 0
    has_scores = rows_.score_columns() is not None
    kinds = [KEYS, VALUES] + ([OPT_VALUES] if sd else []) + ([SCORES] if has_scores else [])
    writers = {
        k: io_files.CheckedWriter(
            folder.join(shard_file(ref.name, k, rank, world)), CHECKSUM_BLOCK_BYTES
        )
        for k in kinds
    }
    row_bytes = rows_.export_row_bytes(t, optim=bool(sd))
    rows, pending = 0, []
    try:
        for chunk in rows_.export_rows(t, chunk_rows(row_bytes)):
            n = chunk.keys.numel()
            if n == 0:
                continue
            parts = {KEYS: chunk.keys, VALUES: chunk.embeddings}
            if sd:
                parts[OPT_VALUES] = chunk.optimizer_state
            if has_scores:
                parts[SCORES] = chunk.scores
            data = {k: host_bytes(v) for k, v in parts.items()}
            for fut in pending:  # the previous chunk's writes
                fut.result()
            pending = [
                pool.submit(lambda k=k, d=d: (writers[k].write(d), progress.update(len(d))))
                for k, d in data.items()
            ]
            rows += n
        for fut in pending:
            fut.result()
        counter = ref.rows.admission_counter()
        if counter is not None:  # its keys and counts, through Counter.dump
            for k in (COUNTER_KEYS, COUNTER_VALUES):
                writers[k] = io_files.CheckedWriter(
                    folder.join(shard_file(ref.name, k, rank, world)), CHECKSUM_BLOCK_BYTES
                )
            counter.dump(writers[COUNTER_KEYS], writers[COUNTER_VALUES], t)
            progress.update(writers[COUNTER_KEYS].nbytes + writers[COUNTER_VALUES].nbytes)
        infos = {k: w.close() for k, w in writers.items()}
    except BaseException:
        for fut in pending:
            fut.exception()
        for w in writers.values():
            w.abort()
        raise
    return Shard(rank=rank, rows=rows, files=infos)


def table_meta(
    ref: TableRef, optim: bool, world: int, shards: list[Shard], counters: bool = False
) -> TableMeta:
    """A table's meta JSON (``world`` 0 and no shards: DCP's, see dcp.py);
    ``counters``: the shards hold the table's admission counter files."""
    rows, t = ref.rows, ref.index
    counter = None
    if counters and rows.admission_counter() is not None:
        item = counter_key_type(rows.admission_counter()).itemsize
        counter = counter_description(
            ref, sum(s.files[COUNTER_KEYS].nbytes // item for s in shards)
        )
    sd = rows.state_dim(t) if optim else 0
    cols = rows.score_columns()
    return TableMeta(
        table_name=ref.name,
        embedding_dtype=rows.value_dtype,
        embedding_dim=ref.dim,
        optim_state_dtype=rows.optim_state_dtype if sd else None,
        optim_state_dim=sd,
        optimizer=rows.optimizer_name,
        score_strategy=[] if cols is None else [s.name for s in rows.strategies],
        step=int(rows.step),
        dist_type=ref.dist_type,
        num_embeddings=ref.num_embeddings,
        world_size=world,
        shards=sorted(shards, key=lambda s: s.rank),
        admission_counter=counter,
        delta_sequence=rows.delta_sequence[t],
        delta_source=rows.delta_source[t],
    )


def check_world(refs: list[TableRef], group: Group) -> None:
    for ref in refs:
        w = ref.sharding_world_size
        if w is not None and w != group.world_size:
            raise ValueError(
                f"{ref.label} is sharded over {w} ranks, but the process group has "
                f"{group.world_size}: pass the sharding's process group as pg"
            )


def tables_of(
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | list[str] | None,
    group: Group,
    api: str,
) -> list[TableRef] | None:
    """The dynamic tables ``api`` (``DynamicEmbDump`` or ``DynamicEmbLoad``) is
    asked for, checked against ``group``; None, with a warning, where the model
    has none."""
    refs = select(model_tables(model), table_names)
    if not refs:
        warnings.warn(f"{api}: the model has no dynamic embedding tables", stacklevel=4)
        return None
    check_world(refs, group)
    return refs


def dump(
    path: str,
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | None = None,
    optim: bool = False,
    pg: dist.ProcessGroup | None = None,
    show_progress: bool = True,
) -> DumpReport | None:
    """``DynamicEmbDump``, returning what was written (None: no dynamic table)."""
    group = group_of(pg, "DynamicEmbDump")
    refs = tables_of(model, table_names, group, "DynamicEmbDump")
    if refs is None:
        return None
    synchronize(refs)
    error, tmp = None, None
    try:
        path = fs.at(path)  # the one resolution of the path to its filesystem
        if group.rank == 0:
            files.prepare_target(path)
            tmp = io_files.make_tmp(path)
            for folder in sorted({ref.collection for ref in refs}):
                tmp.fs.mkdir(tmp.join(folder))
    except BaseException as e:
        error = e
    group.agree(error)
    tmp = path.on(group.broadcast_object(tmp))
    try:
        est = sum(
            ref.rows.sizes()[ref.index] * ref.rows.export_row_bytes(ref.index, optim)
            for ref in refs
        )
        progress = io_files.Progress("DynamicEmbDump", est, show_progress and group.rank == 0)
        shards, error = {}, None
        try:
            with ThreadPoolExecutor(IO_THREADS) as pool:
                for ref in refs:
                    folder = tmp.join(ref.collection)
                    shards[(ref.collection, ref.name)] = _write_table(
                        folder, ref, optim, group.rank, group.world_size, pool, progress
                    )
            for folder in {ref.collection for ref in refs}:
                io_files.fsync_path(tmp.join(folder))
        except BaseException as e:
            error = e
        group.agree(error)
        gathered = group.all_gather_object(shards)
        if group.rank == 0:
            try:
                collections: dict[str, dict[str, dict]] = {}
                for ref in refs:
                    key = (ref.collection, ref.name)
                    meta = table_meta(
                        ref, optim, group.world_size, [g[key] for g in gathered], counters=True
                    )
                    info = io_files.write_small(
                        tmp.join(ref.collection), meta_file(ref.name), meta.encode()
                    )
                    collections.setdefault(ref.collection, {})[ref.name] = info.to_json()
                for folder in collections:
                    io_files.fsync_path(tmp.join(folder))
                body = {
                    "format": FORMAT_NAME,
                    "version": FORMAT_VERSION,
                    "world_size": group.world_size,
                    "optim": bool(optim),
                    "collections": collections,
                }
                io_files.write_manifest(tmp, body, MANIFEST)
                io_files.publish(tmp, path)
                tmp = None
            except BaseException as e:
                error = e
        group.agree(error)
    except BaseException:
        if group.rank == 0 and tmp is not None:
            tmp.fs.rmtree(tmp)
        raise
    seconds = progress.close()
    rows = sum(s.rows for g in gathered for s in g.values())
    nbytes = sum(s.nbytes for g in gathered for s in g.values())
    report = DumpReport(path.fs.absolute(path), len(refs), rows, nbytes, seconds)
    if group.rank == 0:
        line = (
            f"DynamicEmbDump: {report.tables} tables, {rows} rows, {nbytes / 2**20:.1f} MiB "
            f"(all ranks) in {seconds:.2f} s to {report.path}"
        )
        log.info(line)
        if progress.bar is not None:
            print(line, file=sys.stderr)
    return report

"""Reading a checkpoint's tables without a model: the meta JSON of a table,
checked, and its shards' files, every block verified.

``DynamicEmbLoad`` (load.py) reads through these and then reshards the rows
into a model's tables; ``dynamicemb.inference`` reads through them into an
inference table; a stream folder's position is read from the tables' meta
(``dynamicemb.replication.stream_files``). The format itself is layout.py's.
Nothing here imports a model's code.
"""

import os
from collections.abc import Callable
from typing import Any

import torch

from dynamicemb.checkpoint.layout import CheckpointError, FileInfo, Shard, TableMeta, meta_file
from dynamicemb.io import files as io_files
from dynamicemb.io import fs
from dynamicemb.table import check_keys, first_repeat

__all__ = [
    "check_meta_values",
    "check_shard_sizes",
    "check_table_keys",
    "read_shard",
    "table_meta",
]

# A step or delta sequence must leave room for the next one in an int64.
_MAX_COUNT = 2**63 - 2

Columns = Callable[[TableMeta, str], tuple[torch.dtype, int]]


def _columns(meta: TableMeta, kind: str) -> tuple[torch.dtype, int]:
    return meta.columns(kind)


def check_meta_values(meta: TableMeta, what: str, world_size: int) -> None:
    """Refuses the values of a meta JSON that no dump writes (a file edited by
    hand, with its checksums recomputed): a step or delta sequence out of
    ``[0, 2**63 - 2]``, a shard's rank out of ``[0, world_size)`` or repeated,
    a negative row count, a file name that is not a plain name (``../x``,
    ``a/b``), a block size that is not positive.

    Raises:
        CheckpointError: naming the field and its value.
    """
    for name, value in (("step", meta.step), ("delta_sequence", meta.delta_sequence)):
        if value is not None and not 0 <= value <= _MAX_COUNT:
            raise CheckpointError(
                f"{what}: the checkpoint's {name} {value} is out of range [0, {_MAX_COUNT}]"
            )
    if meta.checksum_block_bytes <= 0:
        raise CheckpointError(
            f"{what}: the checkpoint's checksum_block_bytes {meta.checksum_block_bytes} is not "
            "positive"
        )
    ranks = set()
    for shard in meta.shards:
        if not 0 <= shard.rank < max(world_size, 1) or shard.rank in ranks:
            raise CheckpointError(
                f"{what}: the checkpoint lists a shard of rank {shard.rank} "
                f"({'repeated' if shard.rank in ranks else f'world_size {world_size}'})"
            )
        ranks.add(shard.rank)
        if shard.rows < 0:
            raise CheckpointError(
                f"{what}: the shard of rank {shard.rank} has a negative row count {shard.rows}"
            )
        for kind, info in sorted(shard.files.items()):
            try:
                io_files.check_name(info.name, f"the {kind} file")
            except ValueError as e:
                raise CheckpointError(f"{what}: the shard of rank {shard.rank}: {e}") from None
            if info.nbytes < 0:
                raise CheckpointError(
                    f"{what}: the meta JSON records {info.nbytes} bytes for {info.name}"
                )


def table_meta(
    root: str, manifest: dict[str, Any], collection: str, table: str, what: str
) -> tuple[fs.Location, TableMeta]:
    """The folder of ``collection`` in the checkpoint at ``root`` (its
    verified ``manifest``) and the meta JSON of its ``table``, checked
    against the manifest's checksum and for values no dump writes.

    Raises:
        CheckpointError: the checkpoint lacks the collection or the table
            (naming what it has), or the meta JSON is damaged or not valid.
    """
    colls = manifest["collections"]
    if collection not in colls:
        raise CheckpointError(
            f"{what}: the checkpoint at {root} has no collection {collection!r} "
            f"(it has {sorted(colls)})"
        )
    if table not in colls[collection]:
        raise CheckpointError(
            f"{what}: the checkpoint at {root} has no table {table!r} in "
            f"{collection!r} (it has {sorted(colls[collection])})"
        )
    folder = fs.at(root).join(collection)
    info = FileInfo.from_json(colls[collection][table])
    data = io_files.read_small(folder, info, meta_file(table), what, CheckpointError)
    meta = TableMeta.decode(data, os.path.join(folder, meta_file(table)))
    check_meta_values(meta, what, meta.world_size)
    return folder, meta


def check_shard_sizes(
    folder: str, meta: TableMeta, kinds: list[str], what: str, columns: Columns = _columns
) -> None:
    """Checks that every shard's file of ``kinds`` is recorded with the size
    its rows need (``columns``: the dtype and width of a kind) and has that
    size in ``folder``.

    Raises:
        CheckpointError: naming the file and both sizes, or a missing file.
    """
    for shard in meta.shards:
        for kind in kinds:
            dtype, ncols = columns(meta, kind)
            want = shard.rows * ncols * dtype.itemsize
            if shard.files[kind].nbytes != want:
                raise CheckpointError(
                    f"{what}: the meta JSON records {shard.files[kind].nbytes} bytes for "
                    f"{shard.files[kind].name}, {shard.rows} rows need {want}"
                )
        io_files.check_sizes(folder, list(shard.files.values()), what, CheckpointError)


def read_shard(
    folder: str,
    meta: TableMeta,
    shard: Shard,
    kinds: list[str],
    what: str,
    pool=None,
    progress=None,
    columns: Columns = _columns,
) -> dict[str, torch.Tensor]:
    """One dumping rank's rows of a table: every file of ``kinds`` read whole
    into a (rows, columns) tensor, each block's CRC-32 verified (the files
    in parallel on ``pool``, a thread pool; None: one after another).

    Raises:
        CheckpointError: a file that is missing, short or corrupted (named,
            with the block).
    """
    out = {}
    tasks = []
    for k in kinds:
        dtype, ncols = columns(meta, k)
        out[k] = torch.empty(shard.rows, ncols, dtype=dtype)
        info = shard.files[k]

        def task(info=info, t=out[k]):
            io_files.read_verified(
                folder, info, meta.checksum_block_bytes, what, t, CheckpointError
            )
            if progress is not None:
                progress.update(info.nbytes)

        tasks.append(task)
    io_files.run_tasks(tasks, pool)
    return out


def check_table_keys(keys: torch.Tensor, what: str) -> None:
    """Refuses a reserved key, or a key held twice, among a table's keys
    (every copy of a key in a checkpoint reaches one reader).

    Raises:
        CheckpointError: naming the key.
    """
    keys = keys.reshape(-1)
    try:
        check_keys(keys, f"{what}: the checkpoint's keys")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    repeat = first_repeat(keys)
    if repeat is not None:
        i, times = repeat
        raise CheckpointError(f"{what}: key {int(keys[i])} appears {times} times in the checkpoint")

"""Warm start: the rows of a TorchRec EmbeddingCollection or
EmbeddingBagCollection into dynamic tables.

A static table's row ``i`` becomes key ``i`` of the dynamic table of the
same name (or key ``id_maps[table][i]``). The source is the collection's
``state_dict()`` (or a model's holding it: every ``...embeddings.<table>
.weight`` / ``...embedding_bags.<table>.weight``), a file ``torch.save``
wrote it to, or a ``torch.distributed.checkpoint`` folder of it (local or a
URL), written at any world size. Nothing from the source runs code: a file
is read with ``torch.load(weights_only=True)``, a DCP folder with
``dcp_reader`` (its metadata by an unpickler that builds only DCP's own
classes).

Every rank reads the source (a ``torch.save`` file memory-mapped, a DCP
folder's tables whole), keeps the rows whose keys it owns by the table's
routing (``route_keys`` with the table's ``dist_type`` and the model's world
size, so the dynamic model may have any number of ranks) and replaces the
table's contents with them through the load's all-or-nothing step
(``load.apply_all``: a failure on any rank leaves every table as it was).
Rows get the optimizer's initial state and score 0 (not yet used by this
job); TorchRec's fused optimizer state is not carried over.
"""

import io
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.checkpoint.dcp_reader import dcp_load, dcp_reader
from dynamicemb.checkpoint.dump import group_of, tables_of
from dynamicemb.checkpoint.layout import KEYS, VALUES, TableMeta
from dynamicemb.checkpoint.load import TableLoad, _Plan, apply_all
from dynamicemb.io import fs
from dynamicemb.io.files import chunk_rows
from dynamicemb.shard.routing import route_keys
from dynamicemb.shard.tables import TableRef
from dynamicemb.table import first_repeat

__all__ = ["WarmStartReport", "warm_start"]

# A table's weight in a collection's state_dict (or a model's, or DCP's
# flattened names): <prefix>embeddings.<table>.weight, embedding_bags for a bag.
_WEIGHT = re.compile(r"(?:^|\.)(?:embeddings|embedding_bags)\.([^.]+)\.weight$")


@dataclass
class WarmStartReport:
    """What a warm start loaded: per table (over all ranks) the source rows,
    the rows stored and those that did not fit (``TableLoad``)."""

    source: str
    tables: list[TableLoad] = field(default_factory=list)


def _weights(names) -> dict[str, list[str]]:
    """Table name -> the source's keys holding a weight of that name."""
    out: dict[str, list[str]] = {}
    for key in names:
        m = _WEIGHT.search(key)
        if m:
            out.setdefault(m.group(1), []).append(key)
    return out


def _dense(value: Any, key: str) -> torch.Tensor:
    """A source weight as one (rows, dim) tensor on the CPU."""
    shards = getattr(value, "local_shards", None)
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return value.detach().cpu()
    if shards is not None:  # a ShardedTensor: whole when this rank holds all of it
        size = tuple(value.size())
        out = torch.empty(size, dtype=value.dtype)
        held = 0
        for s in shards():
            off = s.metadata.shard_offsets
            rows, cols = s.tensor.shape
            out[off[0] : off[0] + rows, off[1] : off[1] + cols] = s.tensor.detach().cpu()
            held += s.tensor.numel()
        if held == out.numel():
            return out
    raise ValueError(
        f"warm_start: {key} is a {type(value).__name__} this rank does not hold whole; save the "
        "sharded model with torch.distributed.checkpoint and warm-start from that folder"
    )


class _Source:
    """The weights of a state_dict, a torch.save file or a DCP folder."""

    def __init__(self, source: Any) -> None:
        self.dcp = None
        if isinstance(source, Mapping):
            self.name, self.state = "the state_dict", source
        elif isinstance(source, (str, os.PathLike)):
            self.name = os.fspath(source)
            self.state = self._open(self.name)
        else:
            raise TypeError(
                "warm_start: the source must be a state_dict or the path of a torch.save file or "
                f"of a torch.distributed.checkpoint folder, got {type(source).__name__}"
            )
        self.tables = _weights(self.state)

    def _open(self, path: str):
        path = fs.at(path)
        store = path.fs
        if store.isfile(os.path.join(path, ".metadata")):
            return self._dcp_metadata(path)
        if not store.isfile(path):
            raise FileNotFoundError(
                f"warm_start: {path} is neither a file nor a torch.distributed.checkpoint folder"
            )
        source = fs.local_path(path) if store.renames else io.BytesIO(store.read_bytes(path))
        _check_zip(source, path)
        try:
            if store.renames:
                state = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
            else:
                state = torch.load(source, weights_only=True)
        except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
            why = f"{e}".strip().splitlines()[0] if f"{e}".strip() else type(e).__name__
            raise ValueError(
                f"warm_start: {path} is not a state_dict torch.save wrote ({type(e).__name__}: "
                f"{why})"
            ) from None
        if not isinstance(state, Mapping):
            raise ValueError(f"warm_start: {path} holds a {type(state).__name__}, not a state_dict")
        return state

    def _dcp_metadata(self, path: str) -> dict[str, Any]:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.dcp = path
        meta = dcp_reader(path).read_metadata().state_dict_metadata
        return {k: v for k, v in meta.items() if isinstance(v, TensorStorageMetadata)}

    def weight(self, key: str) -> torch.Tensor:
        if self.dcp is None:
            return _dense(self.state[key], key)
        meta = self.state[key]
        out = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)}
        dcp_load(out, self.dcp, no_dist=True)
        return out[key]

    def key_of(self, table: str, source_table: str) -> str:
        keys = self.tables.get(source_table, [])
        if len(keys) != 1:
            have = sorted(self.tables)
            raise ValueError(
                f"warm_start: table {table!r}: {self.name} has "
                + (
                    f"several weights of table {source_table!r}: {keys}"
                    if keys
                    else f"no table {source_table!r} (its tables: {have})"
                )
            )
        return keys[0]


def _check_weight(ref: TableRef, weight: torch.Tensor, what: str) -> None:
    """A source weight a table can be filled from: (rows >= 1, dim) of a
    floating dtype (an integer or bool weight would be cast into rows).

    Raises:
        ValueError: naming ``what``, the shape or dtype and the table.
    """
    if weight.dim() != 2 or weight.shape[1] != ref.dim:
        raise ValueError(
            f"warm_start: {ref.label}: {what} has shape {tuple(weight.shape)}, the table's dim "
            f"is {ref.dim}"
        )
    if weight.shape[0] == 0:
        shape = tuple(weight.shape)
        raise ValueError(f"warm_start: {ref.label}: {what} has no rows (shape {shape})")
    if not weight.is_floating_point():
        raise ValueError(
            f"warm_start: {ref.label}: {what} is {weight.dtype}, not a floating-point weight; "
            "convert it to the embeddings' dtype if it holds embeddings"
        )


def _check_zip(source, path: str) -> None:
    """The CRC-32 of every member of a torch.save zip file (torch reads the
    members without checking them: a flipped byte would load silently).

    Raises:
        ValueError: a member whose bytes do not match their CRC-32, or a zip
            file that cannot be read, naming ``path``.
    """
    if not zipfile.is_zipfile(source):
        return  # not a zip: torch.load names what it is not
    if isinstance(source, io.BytesIO):
        source.seek(0)
    try:
        with zipfile.ZipFile(source) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise ValueError(f"warm_start: {path} is a damaged zip file ({e})") from None
    finally:
        if isinstance(source, io.BytesIO):
            source.seek(0)
    if bad is not None:
        raise ValueError(f"warm_start: {path} is corrupted: its member {bad} fails its CRC-32")


def _id_map(id_maps: Mapping[str, Any] | None, ref: TableRef, rows: int) -> torch.Tensor | None:
    if not id_maps or ref.name not in id_maps:
        return None
    ids = id_maps[ref.name]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(
            f"warm_start: id_maps[{ref.name!r}] must be a 1-D int64 tensor, got "
            + (
                f"{ids.dtype} of shape {tuple(ids.shape)}"
                if isinstance(ids, torch.Tensor)
                else type(ids).__name__
            )
        )
    if ids.numel() != rows:
        raise ValueError(
            f"warm_start: id_maps[{ref.name!r}] has {ids.numel()} ids for the source's {rows} rows"
        )
    ids = ids.cpu()
    if first_repeat(ids) is not None:
        raise ValueError(f"warm_start: id_maps[{ref.name!r}] repeats ids")
    return ids


def _plan(ref: TableRef) -> _Plan:
    """The load's plan of a table filled from static rows: no optimizer
    state, no scores, the table's own step and delta sequence."""
    meta = TableMeta(
        table_name=ref.name,
        embedding_dtype=ref.rows.value_dtype,
        embedding_dim=ref.dim,
        optim_state_dtype=None,
        optim_state_dim=0,
        optimizer=None,
        score_strategy=[],
        step=int(ref.rows.step),
        dist_type=ref.dist_type,
        num_embeddings=ref.num_embeddings,
        world_size=1,
        shards=[],
        delta_sequence=ref.rows.delta_sequence[ref.index],
    )
    return _Plan(ref, meta, "", with_state=False, optim=False)


def _mine(ref: TableRef, weight: torch.Tensor, ids: torch.Tensor | None, group) -> dict:
    """This rank's rows of a table: the keys it owns and their embeddings."""
    keys, embs = [], []
    step = chunk_rows(weight.shape[1] * weight.element_size())
    for lo in range(0, weight.shape[0], step):
        hi = min(lo + step, weight.shape[0])
        k = ids[lo:hi] if ids is not None else torch.arange(lo, hi, dtype=torch.int64)
        if group.distributed:
            own = route_keys(k, group.world_size, ref.dist_type, ref.num_embeddings) == group.rank
            idx = own.nonzero().reshape(-1)
            k, e = k[idx], weight[lo:hi][idx]
        else:
            e = weight[lo:hi]
        keys.append(k)
        embs.append(e.to(ref.rows.value_dtype))
    return {KEYS: torch.cat(keys).reshape(-1, 1), VALUES: torch.cat(embs)}


def warm_start(
    model: torch.nn.Module,
    source: Mapping[str, Any] | str,
    tables: list[str] | dict[str, str] | None = None,
    id_maps: Mapping[str, torch.Tensor] | None = None,
    pg: dist.ProcessGroup | None = None,
) -> WarmStartReport | None:
    """Fills dynamic tables with the rows of a TorchRec EmbeddingCollection
    or EmbeddingBagCollection (see the module docstring); every rank calls it.

    Args:
        model (torch.nn.Module): the model sharded with the dynamicemb sharders.
        source: the collection's (or a model's) ``state_dict()``, or the path
            or URL of a ``torch.save`` file of it or of a
            ``torch.distributed.checkpoint`` folder of it.
        tables: the dynamic tables to fill: a list of names (each filled from
            the source's table of the same name), or a dict from a dynamic
            table to the source's table name. None: every dynamic table of
            the model, each from its namesake.
        id_maps: per table, an (n) int64 tensor of distinct keys, one per
            source row: row ``i`` becomes key ``id_maps[table][i]``. Absent:
            row ``i`` becomes key ``i``.
        pg (Optional[dist.ProcessGroup]): the sharding's process group.

    Returns:
        WarmStartReport, or None (with a warning) when the model has no
        dynamic table.

    Raises:
        ValueError: a table the model or the source lacks, a dim that differs
            (naming both), a weight without rows or not of a floating dtype
            (int64, bool: named), a bad id map. Nothing is changed then.
    """
    group = group_of(pg, "warm_start")
    names = list(tables) if tables is not None else None
    refs = tables_of(model, names, group, "warm_start")
    if refs is None:
        return None
    sources = tables if isinstance(tables, dict) else {}
    plans, received, rows, error = [], [], [], None
    try:
        src = _Source(source)
        for ref in refs:
            key = src.key_of(ref.name, sources.get(ref.name, ref.name))
            weight = src.weight(key)
            _check_weight(ref, weight, f"{src.name}'s {key}")
            ids = _id_map(id_maps, ref, weight.shape[0])
            plans.append(_plan(ref))
            rows.append(weight.shape[0])
            received.append(_mine(ref, weight, ids, group))
        unknown = sorted(set(id_maps or {}) - {ref.name for ref in refs})
        if unknown:
            raise ValueError(f"warm_start: id_maps names tables that are not filled: {unknown}")
    except BaseException as e:
        error = e
    group.agree(error)
    results = apply_all(plans, received, group)
    totals = group.all_reduce([v for r in results for v in r])
    report = WarmStartReport(src.name)
    for i, p in enumerate(plans):
        report.tables.append(
            TableLoad(p.ref.collection, p.ref.name, rows[i], totals[2 * i], totals[2 * i + 1])
        )
    if group.rank == 0:
        for t in report.tables:
            if t.dropped:
                warnings.warn(
                    f"warm_start: table {t.table!r}: {t.dropped} of {t.checkpoint_rows} rows did "
                    "not fit",
                    stacklevel=2,
                )
    return report

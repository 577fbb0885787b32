"""Dynamic tables in ``torch.distributed.checkpoint`` (DCP).

``DynamicEmbStateful(model)`` is a ``Stateful``: put it into the state dict
given to ``dcp.save`` / ``dcp.load`` next to the model's and optimizer's, and
the dynamic tables are saved and loaded in the same call, at any world size::

    state = {"model": model.state_dict(), "optim": optimizer.state_dict(),
             "dynamicemb": DynamicEmbStateful(model)}
    dcp.save(state, checkpoint_id=path)
    ...
    dcp.load(state, checkpoint_id=path)   # at any world size

Why it is built this way: DCP reshards a tensor by its global shape, which
it needs before it reads anything (``state_dict()`` is asked for the tensors
to load into). A hash table has no global shape, and how many rows each
rank holds is only known from the checkpoint. So the rows are saved as
objects (DCP pickles them with ``torch.save``), in ``NUM_SHARDS`` virtual
shards per table whose names do not depend on the world size: key ``k``
belongs to virtual shard ``route_keys(k, NUM_SHARDS, "hash_roundrobin")``,
and virtual shard ``v`` is written (and read) by rank ``v % world_size``.
Saving sends each row to the rank writing its shard; loading reads a rank's
shards, sends each row to the rank owning its key now, and replaces the
tables' contents all or nothing, as ``DynamicEmbLoad`` does. The format is
DCP's, not the folder format of ``DynamicEmbDump``; ``state_dict()`` on load
reads the current tables once (their rows are then replaced).
"""

import json
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.checkpoint.dump import check_world, group_of, table_meta
from dynamicemb.checkpoint.layout import (
    KEYS,
    OPT_VALUES,
    SCORES,
    VALUES,
    CheckpointError,
    TableMeta,
)
from dynamicemb.checkpoint.load import _pack, _Plan, _unpack, apply_all, check_meta
from dynamicemb.io import Group
from dynamicemb.shard.routing import route_keys
from dynamicemb.shard.tables import TableRef, model_tables, select

# Virtual shards per table: fixed, so that names do not depend on the world.
NUM_SHARDS = 64


def _meta(ref: TableRef, optim: bool) -> TableMeta:
    return table_meta(ref, optim, world=0, shards=[])


def _rows(ref: TableRef, meta: TableMeta) -> dict[str, torch.Tensor]:
    """This rank's rows of a table, on the CPU, as the checkpoint's columns."""
    parts = list(ref.rows.export_rows(ref.index, 1 << 20))
    out = {KEYS: torch.cat([p.keys for p in parts]).reshape(-1, 1).cpu()}
    out[VALUES] = torch.cat([p.embeddings for p in parts]).cpu()
    if meta.optim_state_dim:
        out[OPT_VALUES] = torch.cat([p.optimizer_state for p in parts]).cpu()
    if meta.num_scores:
        out[SCORES] = torch.cat([p.scores for p in parts]).cpu()
    return out


def _send(meta: TableMeta, rows: dict[str, torch.Tensor], dest: torch.Tensor, group: Group):
    if not group.distributed:
        return rows
    return _unpack(meta, group.exchange(_pack(rows), dest))


class DynamicEmbStateful:
    """The dynamic tables of a sharded model as a DCP ``Stateful``.

    Args:
        model (torch.nn.Module): the sharded model.
        optim (bool): save and load the optimizer state too. Defaults to True.
        table_names: as for ``DynamicEmbLoad`` (None: every dynamic table).
        pg (Optional[dist.ProcessGroup]): the sharding's process group.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optim: bool = True,
        table_names: dict[str, list[str]] | list[str] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> None:
        self.model = model
        self.optim = optim
        self.table_names = table_names
        self.pg = pg

    def _refs(self) -> tuple[list[TableRef], Group]:
        group = group_of(self.pg)
        refs = select(model_tables(self.model), self.table_names)
        check_world(refs, group)
        return refs, group

    def state_dict(self) -> dict[str, Any]:
        refs, group = self._refs()
        metas = {f"{r.collection}/{r.name}": _meta(r, self.optim) for r in refs}
        shards: dict[str, Any] = {}
        for ref in refs:
            meta = metas[f"{ref.collection}/{ref.name}"]
            rows = _rows(ref, meta)
            virtual = route_keys(rows[KEYS].reshape(-1), NUM_SHARDS, "hash_roundrobin")
            rows = _send(meta, rows, virtual % group.world_size, group)
            virtual = route_keys(rows[KEYS].reshape(-1), NUM_SHARDS, "hash_roundrobin")
            for v in range(group.rank, NUM_SHARDS, group.world_size):
                mine = virtual == v
                # A tuple is a leaf to DCP: saved as one object, not as tensors.
                shards[f"{ref.collection}/{ref.name}/{v}"] = tuple(
                    (k, t[mine]) for k, t in sorted(rows.items())
                )
        meta_json = json.dumps({k: m.encode().decode() for k, m in metas.items()}, sort_keys=True)
        return {"meta": meta_json, "shards": shards}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        refs, group = self._refs()
        error, plans, received = None, [], []
        try:
            metas = json.loads(state_dict["meta"])
            for ref in refs:
                key = f"{ref.collection}/{ref.name}"
                if key not in metas:
                    raise CheckpointError(f"{ref.label}: not in the checkpoint")
                meta = TableMeta.decode(metas[key].encode(), f"checkpoint meta of {key}")
                plans.append(_Plan(ref, meta, "", check_meta(meta, ref, self.optim), self.optim))
        except BaseException as e:
            error = e
        group.agree(error)
        for p in plans:
            key = f"{p.ref.collection}/{p.ref.name}"
            parts = [
                dict(state_dict["shards"][f"{key}/{v}"])
                for v in range(group.rank, NUM_SHARDS, group.world_size)
            ]
            rows = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
            dest = route_keys(
                rows[KEYS].reshape(-1), group.world_size, p.ref.dist_type, p.ref.num_embeddings
            )
            received.append(_send(p.meta, rows, dest, group))
        apply_all(plans, received, group)

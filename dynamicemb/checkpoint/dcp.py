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

DCP's own reader unpickles what it reads (its ``.metadata`` file, and these
rows with ``torch.load(weights_only=False)``): a crafted checkpoint would run
code. So a ``DynamicEmbStateful`` loads through ``dcp_reader``
(``dcp.load(state, storage_reader=dcp_reader(path))``, which runs no code
from the files: ``dcp_reader.py``), and refuses a ``dcp.load`` with DCP's
own reader, before anything is read, unless it was built with
``trusted_checkpoint=True`` (for a checkpoint you wrote yourself).
"""

import json
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.checkpoint.dcp_reader import dcp_load_reader, is_safe_reader
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


def my_shards(group: Group) -> range:
    """The virtual shards this rank writes and reads."""
    return range(group.rank, NUM_SHARDS, group.world_size)


def virtual_shards(ref: TableRef, meta: TableMeta, group: Group) -> dict[int, tuple]:
    """Every row of a table, over all ranks, in this rank's virtual shards
    (``my_shards``): each a tuple of (column, tensor) pairs (a tuple is a
    leaf to DCP: saved as one object, not as tensors). Collective."""
    rows = _rows(ref, meta)
    virtual = route_keys(rows[KEYS].reshape(-1), NUM_SHARDS, "hash_roundrobin")
    rows = _send(meta, rows, virtual % group.world_size, group)
    virtual = route_keys(rows[KEYS].reshape(-1), NUM_SHARDS, "hash_roundrobin")
    return {
        v: tuple((k, t[virtual == v]) for k, t in sorted(rows.items())) for v in my_shards(group)
    }


def received_rows(plan: _Plan, parts: list[Any], group: Group) -> dict[str, torch.Tensor]:
    """The rows of ``parts`` (this rank's virtual shards of a table, as
    ``virtual_shards`` made them) sent to the ranks owning their keys now;
    the rows this rank owns. Collective."""
    parts = [dict(part) for part in parts]
    if parts:
        rows = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
    else:  # more ranks than virtual shards
        rows = _unpack(plan.meta, torch.empty(0, 0, dtype=torch.uint8))
    dest = route_keys(
        rows[KEYS].reshape(-1), group.world_size, plan.ref.dist_type, plan.ref.num_embeddings
    )
    return _send(plan.meta, rows, dest, group)


class DynamicEmbStateful:
    """The dynamic tables of a sharded model as a DCP ``Stateful``.

    Args:
        model (torch.nn.Module): the sharded model.
        optim (bool): save and load the optimizer state too. Defaults to True.
        table_names: as for ``DynamicEmbLoad`` (None: every dynamic table).
        pg (Optional[dist.ProcessGroup]): the sharding's process group.
        trusted_checkpoint (bool): let a ``dcp.load`` with DCP's own reader,
            which unpickles the checkpoint's files (running any code a crafted
            one holds), load the tables: only for checkpoints you wrote.
            Defaults to False: such a load is refused (load with
            ``storage_reader=dcp_reader(path)``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optim: bool = True,
        table_names: dict[str, list[str]] | list[str] | None = None,
        pg: dist.ProcessGroup | None = None,
        trusted_checkpoint: bool = False,
    ) -> None:
        self.model = model
        self.optim = optim
        self.table_names = table_names
        self.pg = pg
        self.trusted_checkpoint = trusted_checkpoint

    def _refs(self, call: str) -> tuple[list[TableRef], Group]:
        group = group_of(self.pg, call)
        refs = select(model_tables(self.model), self.table_names)
        check_world(refs, group)
        return refs, group

    def state_dict(self) -> dict[str, Any]:
        """The rows to save, or what a ``dcp.load`` reads them into.

        Raises:
            CheckpointError: within a ``dcp.load`` whose reader unpickles
                (DCP's own), unless ``trusted_checkpoint``: nothing is read.
        """
        loading, reader = dcp_load_reader()
        if loading and not self.trusted_checkpoint and not is_safe_reader(reader):
            raise CheckpointError(
                "DynamicEmbStateful: this dcp.load reads the checkpoint with a reader that "
                "unpickles its files (DCP's own: a crafted checkpoint runs code); load with "
                "dcp.load(state, storage_reader=dynamicemb.checkpoint.dcp_reader(path)), or, "
                "for a checkpoint you wrote, build DynamicEmbStateful(model, "
                "trusted_checkpoint=True)"
            )
        refs, group = self._refs("DynamicEmbStateful.state_dict")
        metas = {f"{r.collection}/{r.name}": _meta(r, self.optim) for r in refs}
        shards: dict[str, Any] = {}
        for ref in refs:
            meta = metas[f"{ref.collection}/{ref.name}"]
            for v, part in virtual_shards(ref, meta, group).items():
                shards[f"{ref.collection}/{ref.name}/{v}"] = part
        meta_json = json.dumps({k: m.encode().decode() for k, m in metas.items()}, sort_keys=True)
        return {"meta": meta_json, "shards": shards}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        refs, group = self._refs("DynamicEmbStateful.load_state_dict")
        error, plans = None, []
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
        received = []
        for p in plans:
            key = f"{p.ref.collection}/{p.ref.name}"
            parts = [state_dict["shards"][f"{key}/{v}"] for v in my_shards(group)]
            received.append(received_rows(p, parts, group))
        apply_all(plans, received, group)

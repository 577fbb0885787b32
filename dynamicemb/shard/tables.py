"""The dynamic tables of a sharded model, as checkpoints, deltas and metrics
name them.

One rule names a collection: its module path in the model, the model itself
being ``model`` (``model.sparse_arch``, ``model.sparse.ebc``;
``collection_name``). Checkpoint folders, the collections of an
``incremental_dump`` and the ``dynamicemb.collection.name`` attribute of
the metrics all use it. Where a user names a collection (``table_names``,
thresholds, scores), the name, the bare module path or, when only one
collection has it, the module's own name are taken (``collection_key``).

Each table is a ``TableRef``: its collection and name, the rows object of
the module holding it (``TableRows``) and its index there, and its routing.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb.dynamicemb_config import DynamicEmbTableOptions
from dynamicemb.io.files import check_name
from dynamicemb.storage.table_rows import TableRows

__all__ = [
    "ROOT_MODULE",
    "TableRef",
    "collection_key",
    "collection_name",
    "model_tables",
    "resolve",
    "select",
]

ROOT_MODULE = "model"


def collection_name(fqn: str) -> str:
    """The name of the collection at module path ``fqn`` ('' for the model)."""
    return ROOT_MODULE if not fqn else f"{ROOT_MODULE}.{fqn}"


@dataclass
class TableRef:
    """One dynamic table on this rank.

    Attributes:
        collection (str): the collection's name (``collection_name``).
        name (str): the table's name.
        rows (TableRows): the rows of the fused tables holding it.
        index (int): its table index in ``rows``.
        num_embeddings (int): its TorchRec config's rows (continuous routing).
        dist_type (str): its key routing.
        sharding_world_size (int or None): ranks it is sharded over.
        sharding_rank (int or None): this rank's index among them.
    """

    collection: str
    name: str
    rows: TableRows
    index: int
    num_embeddings: int
    dist_type: str
    sharding_world_size: int | None
    sharding_rank: int | None = None

    @property
    def label(self) -> str:
        return f"table {self.name!r} of {self.collection!r}"

    @property
    def dim(self) -> int:
        return self.rows.dims[self.index]

    @property
    def options(self) -> DynamicEmbTableOptions:
        return self.rows.options[self.index]


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    from torchrec.distributed.model_parallel import get_unwrapped_module

    return get_unwrapped_module(model)


def model_tables(model: torch.nn.Module) -> dict[str, dict[str, TableRef]]:
    """Every dynamic table of a sharded model on this rank: collection name
    -> table name -> ``TableRef``, collections in module order.

    Raises:
        ValueError: a table name that cannot name a file (checkpoints and
            deltas store tables by name).
    """
    from dynamicemb.shard.embedding import (
        ShardedDynamicEmbeddingBagCollection,
        ShardedDynamicEmbeddingCollection,
    )
    from dynamicemb.shard.lookup import dynamic_embedding_kernels

    out: dict[str, dict[str, TableRef]] = {}
    kinds = (ShardedDynamicEmbeddingCollection, ShardedDynamicEmbeddingBagCollection)
    for fqn, module in _unwrap(model).named_modules():
        if not isinstance(module, kinds):
            continue
        collection = collection_name(fqn)
        env = getattr(module, "_env", None)
        world = getattr(env, "world_size", None)
        rank = getattr(env, "rank", None)
        tables: dict[str, TableRef] = {}
        for kernel in dynamic_embedding_kernels(module):
            rows = kernel.emb_module.rows
            for t, config in enumerate(kernel.config.embedding_tables):
                check_name(config.name, "table name")
                tables[config.name] = TableRef(
                    collection=collection,
                    name=config.name,
                    rows=rows,
                    index=t,
                    num_embeddings=int(config.num_embeddings),
                    dist_type=rows.options[t].dist_type,
                    sharding_world_size=world,
                    sharding_rank=rank,
                )
        if tables:
            out[collection] = tables
    return out


def collection_key(key: str, collections: Iterable[str]) -> str:
    """The collection a user's ``key`` names: its name itself, its module
    path, or the module's own name when only one collection has it."""
    collections = list(collections)
    if key in collections:
        return key
    if collection_name(key) in collections:
        return collection_name(key)
    matches = [c for c in collections if c.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ValueError(f"table_names: collection {key!r} is ambiguous: {matches}")
    raise ValueError(f"table_names: the model has no collection {key!r} with dynamic tables")


def select(
    tables: dict[str, dict[str, TableRef]],
    table_names: dict[str, list[str]] | list[str] | None,
) -> list[TableRef]:
    """The tables ``table_names`` selects (None: all), in model order.

    A dict maps a collection (``collection_key``) to table names; a list
    names tables of any collection.

    Raises:
        ValueError: an unknown collection or table (the message names it).
    """
    if table_names is None:
        return [ref for coll in tables.values() for ref in coll.values()]
    chosen: set[tuple[str, str]] = set()
    if isinstance(table_names, dict):
        for key, names in table_names.items():
            coll = collection_key(key, tables)
            if isinstance(names, str):
                raise ValueError(f"table_names[{key!r}] must be a list of names, got {names!r}")
            for name in names:
                if name not in tables[coll]:
                    raise ValueError(
                        f"table_names: collection {coll!r} has no dynamic table {name!r} "
                        f"(it has {sorted(tables[coll])})"
                    )
                chosen.add((coll, name))
    elif isinstance(table_names, (list, tuple)):
        for name in table_names:
            hits = [(c, name) for c, refs in tables.items() if name in refs]
            if not hits:
                raise ValueError(f"table_names: the model has no dynamic table {name!r}")
            chosen.update(hits)
    else:
        raise TypeError(
            "table_names must be a dict of collection -> table names, a list of table names or "
            f"None, got {type(table_names).__name__}"
        )
    return [ref for c, refs in tables.items() for n, ref in refs.items() if (c, n) in chosen]


def resolve(
    tables: dict[str, dict[str, TableRef]], per_table: Any, what: str
) -> list[tuple[TableRef, Any]]:
    """The (table, value) pairs of a ``{collection: {table: value}}`` dict.

    Raises:
        ValueError: not a dict of dicts, an unknown collection or table.
    """
    if not isinstance(per_table, dict):
        raise ValueError(
            f"{what}: expected a dict of collection -> {{table name: value}}, got "
            f"{type(per_table).__name__}"
        )
    out = []
    for key, names in per_table.items():
        if not isinstance(key, str) or not isinstance(names, dict):
            raise ValueError(
                f"{what}: expected a dict of collection -> {{table name: value}}, got entry "
                f"{key!r}: {names!r}"
            )
        coll = collection_key(key, tables)
        for name, value in names.items():
            if name not in tables[coll]:
                raise ValueError(
                    f"{what}: collection {coll!r} has no dynamic table {name!r} (it has "
                    f"{sorted(tables[coll])})"
                )
            out.append((tables[coll][name], value))
    return out


def synchronize(refs: list[TableRef]) -> None:
    """Waits for the work queued on each CUDA device the tables' rows are on;
    tables on the CPU touch no CUDA device (a CPU process forked from one that
    used CUDA cannot)."""
    for device in {ref.rows.device for ref in refs if ref.rows.device.type == "cuda"}:
        torch.cuda.synchronize(device)

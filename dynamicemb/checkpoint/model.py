"""The dynamic tables of a model, by collection, and the ``table_names``
selection of DynamicEmbDump / DynamicEmbLoad."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb.admission.counters import COUNT_DTYPE, counter_key_type
from dynamicemb.checkpoint.layout import check_name, collection_dir, key_dtype_name
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.types import Counter


@dataclass
class TableRef:
    """One dynamic table on this rank.

    Attributes:
        collection (str): the collection's folder (``model.<module path>``).
        name (str): the table's name.
        module (BatchedDynamicEmbeddingTablesV2): the fused tables holding it.
        index (int): its table index in ``module``.
        num_embeddings (int): its TorchRec config's rows (continuous routing).
        dist_type (str): its key routing.
        sharding_world_size (int or None): ranks it is sharded over.
        sharding_rank (int or None): this rank's index among them.
    """

    collection: str
    name: str
    module: BatchedDynamicEmbeddingTablesV2
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
        return self.module.dims[self.index]

    @property
    def counter(self) -> Counter | None:
        """The admission counter holding the table's counts (its admitter's
        ``state()``), or None."""
        admitter = self.module.admitter
        return None if admitter is None else admitter.state()

    def counter_description(self, entries: int) -> dict[str, Any]:
        """The meta JSON's ``admission_counter`` of the table: the counter's
        class and file dtypes, ``entries`` over all ranks, and the threshold
        and counter share of its strategy where it has them."""
        counter = self.counter
        assert counter is not None
        strategy = self.module.table_options[self.index].admit_strategy
        out: dict[str, Any] = {
            "counter": type(counter).__name__,
            "key_dtype": key_dtype_name(counter_key_type(counter)),
            "count_dtype": key_dtype_name(COUNT_DTYPE),
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


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    try:
        from torchrec.distributed.model_parallel import get_unwrapped_module
    except ImportError:  # pragma: no cover - torchrec is a requirement of sharding
        return model
    return get_unwrapped_module(model)


def dynamic_tables(model: torch.nn.Module) -> dict[str, dict[str, TableRef]]:
    """Every dynamic table of a sharded model on this rank: collection folder
    -> table name -> ``TableRef``, collections in module order."""
    from dynamicemb.shard import (
        ShardedDynamicEmbeddingBagCollection,
        ShardedDynamicEmbeddingCollection,
        dynamic_embedding_kernels,
    )

    out: dict[str, dict[str, TableRef]] = {}
    root = _unwrap(model)
    kinds = (ShardedDynamicEmbeddingCollection, ShardedDynamicEmbeddingBagCollection)
    for fqn, module in root.named_modules():
        if not isinstance(module, kinds):
            continue
        folder = collection_dir(fqn)
        env = getattr(module, "_env", None)
        world = getattr(env, "world_size", None)
        rank = getattr(env, "rank", None)
        tables: dict[str, TableRef] = {}
        for kernel in dynamic_embedding_kernels(module):
            emb = kernel.emb_module
            for t, config in enumerate(kernel.config.embedding_tables):
                check_name(config.name, "table name")
                tables[config.name] = TableRef(
                    collection=folder,
                    name=config.name,
                    module=emb,
                    index=t,
                    num_embeddings=int(config.num_embeddings),
                    dist_type=emb.table_options[t].dist_type,
                    sharding_world_size=world,
                    sharding_rank=rank,
                )
        if tables:
            out[folder] = tables
    return out


def collection_key(key: str, folders: Iterable[str]) -> str:
    """The folder a ``table_names`` key names: the folder itself, the module
    path, or the module's own name when only one collection has it."""
    folders = list(folders)
    if key in folders:
        return key
    if collection_dir(key) in folders:
        return collection_dir(key)
    matches = [f for f in folders if f.rsplit(".", 1)[-1] == key]
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

    A dict maps a collection (its folder ``model.<path>``, its path, or its
    name) to table names; a list names tables of any collection.

    Raises:
        ValueError: an unknown collection or table (the message names it).
    """
    if table_names is None:
        return [ref for coll in tables.values() for ref in coll.values()]
    chosen: set[tuple[str, str]] = set()
    if isinstance(table_names, dict):
        for key, names in table_names.items():
            folder = collection_key(key, tables)
            if isinstance(names, str):
                raise ValueError(f"table_names[{key!r}] must be a list of names, got {names!r}")
            for name in names:
                if name not in tables[folder]:
                    raise ValueError(
                        f"table_names: collection {folder!r} has no dynamic table {name!r} "
                        f"(it has {sorted(tables[folder])})"
                    )
                chosen.add((folder, name))
    elif isinstance(table_names, (list, tuple)):
        for name in table_names:
            hits = [(f, name) for f, coll in tables.items() if name in coll]
            if not hits:
                raise ValueError(f"table_names: the model has no dynamic table {name!r}")
            chosen.update(hits)
    else:
        raise TypeError(
            "table_names must be a dict of collection -> table names, a list of table names or "
            f"None, got {type(table_names).__name__}"
        )
    return [ref for f, coll in tables.items() for n, ref in coll.items() if (f, n) in chosen]


def optimizer_name(module: BatchedDynamicEmbeddingTablesV2) -> str:
    return str(module.optimizer.optimizer.name)

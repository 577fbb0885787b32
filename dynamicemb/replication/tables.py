"""The dynamic tables of a model, as the replication API names them.

Collections are named by their path in the model, the model itself being
``model`` (``model.sparse.ebc``), as checkpoints name their folders; a user's
dict may also name a collection by its module path or, when unambiguous, its
own name. The table discovery is the checkpoint package's.
"""

from typing import Any

import torch

from dynamicemb.checkpoint.model import TableRef, collection_key, dynamic_tables

__all__ = [
    "TableRef",
    "check_routable",
    "collection_key",
    "model_tables",
    "owned",
    "resolve",
    "world_of",
]


def model_tables(model: torch.nn.Module) -> dict[str, dict[str, TableRef]]:
    """Collection path -> table name -> ``TableRef``, in model order."""
    return dynamic_tables(model)


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
        folder = collection_key(key, tables)
        for name, value in names.items():
            if name not in tables[folder]:
                raise ValueError(
                    f"{what}: collection {folder!r} has no dynamic table {name!r} (it has "
                    f"{sorted(tables[folder])})"
                )
            out.append((tables[folder][name], value))
    return out


def world_of(ref: TableRef) -> tuple[int, int]:
    """(rank, world size) of the table's sharding ((0, 1) unsharded)."""
    world = ref.sharding_world_size or 1
    rank = ref.sharding_rank or 0
    return rank, world


def check_routable(ref: TableRef, what: str) -> None:
    """Deltas are routed by key: ``continuous`` tables are refused.

    Raises:
        NotImplementedError: the table's dist_type is ``continuous``.
    """
    if ref.dist_type == "continuous":
        raise NotImplementedError(
            f"{what}: {ref.label} is sharded with dist_type='continuous', whose range-based "
            "key -> rank mapping incremental dumps and replays do not implement; use "
            "'roundrobin' or 'hash_roundrobin'"
        )


def owned(ref: TableRef, keys: torch.Tensor) -> torch.Tensor:
    """(n) bool: the keys this rank owns by the table's own routing (its
    dist_type and world size)."""
    from dynamicemb.shard.routing import route_keys

    rank, world = world_of(ref)
    if world == 1 or not keys.numel():
        return torch.ones(keys.numel(), dtype=torch.bool, device=keys.device)
    return route_keys(keys, world, ref.dist_type, ref.num_embeddings) == rank

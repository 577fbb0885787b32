"""Replication's rules over the tables of a model (``dynamicemb.shard.tables``
finds and names them): which rank owns a key of a delta, and which tables a
delta can be routed for."""

import torch

from dynamicemb.shard.routing import route_keys
from dynamicemb.shard.tables import TableRef

__all__ = ["check_routable", "owned", "world_of"]


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
    rank, world = world_of(ref)
    if world == 1 or not keys.numel():
        return torch.ones(keys.numel(), dtype=torch.bool, device=keys.device)
    return route_keys(keys, world, ref.dist_type, ref.num_embeddings) == rank

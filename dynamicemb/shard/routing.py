"""Row-wise routing of keys to ranks for sharded dynamic tables.

A dynamic table keeps raw global ids: a key is stored as itself on the rank
that owns it, never divided or re-indexed. Which rank that is depends only on
the key, the table's ``dist_type`` and the world size:

* ``"continuous"``: TorchRec's block bucketization, ``key // block`` with
  ``block = ceil(num_embeddings / world_size)``, for ``0 <= key < block *
  world_size``; any other key (negative, or past the declared rows) falls back
  to ``key mod world_size``.
* ``"roundrobin"`` (the default): ``key mod world_size``, a mod in
  ``[0, world_size)`` for negative keys too (``torch.remainder``).
* ``"hash_roundrobin"``: ``route_hash(key) mod world_size``, with a hash that
  is not the table's bucket hash, so the keys one rank owns still spread over
  all of its buckets.

The rule is defined once, in ``cc/routing/routing.h``, and runs as the
``torch.ops.dynamicemb.route_keys`` op on CPU and CUDA tensors.
"""

import math
from collections.abc import Sequence

import torch

from .._checks import is_int
from ..dynamicemb_config import DIST_TYPES
from ..table import ops

__all__ = [
    "DIST_TYPE_CODES",
    "continuous_block_size",
    "dist_type_code",
    "route_keys",
    "route_keys_by_feature",
]

# dist_type -> the op's DistType value (cc/routing/routing.h), in DIST_TYPES order
# (tests/config/test_native_parity.py proves it equal to the C++ one).
DIST_TYPE_CODES = {name: code for code, name in enumerate(DIST_TYPES)}


def dist_type_code(dist_type: str) -> int:
    """The ``route_keys`` code of ``dist_type``.

    Raises:
        ValueError: ``dist_type`` is not one of ``DIST_TYPES``.
    """
    if dist_type not in DIST_TYPE_CODES:
        raise ValueError(f"dist_type must be one of {DIST_TYPES}, got {dist_type!r}")
    return DIST_TYPE_CODES[dist_type]


def continuous_block_size(num_embeddings: int, world_size: int) -> int:
    """Rows per rank of ``"continuous"`` routing: ``ceil(num_embeddings / world_size)``.

    Raises:
        ValueError: ``num_embeddings`` or ``world_size`` is not a positive int.
    """
    for name, value in (("num_embeddings", num_embeddings), ("world_size", world_size)):
        if not is_int(value) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return math.ceil(int(num_embeddings) / int(world_size))


def route_keys_by_feature(
    keys: torch.Tensor,
    feature_ids: torch.Tensor,
    dist_types: torch.Tensor,
    blocks: torch.Tensor,
    world_size: int,
) -> torch.Tensor:
    """Owning rank of each key, with a routing per feature.

    Args:
        keys (torch.Tensor): (n) int64 raw keys.
        feature_ids (torch.Tensor): (n) int64, the feature of each key.
        dist_types (torch.Tensor): (num_features) int64 ``DIST_TYPE_CODES``
            values.
        blocks (torch.Tensor): (num_features) int64 continuous block sizes
            (``continuous_block_size``; read for continuous features only).
        world_size (int): ranks of the table.

    Returns:
        torch.Tensor: (n) int64 ranks in ``[0, world_size)`` on the keys'
        device.

    Raises:
        ValueError: bad shapes, a non-positive ``world_size``; on the CPU also
            an unknown dist type, a non-positive continuous block or a feature
            id out of range (CUDA does not read values on the host).
    """
    return ops().route_keys(keys, feature_ids, dist_types, blocks, int(world_size))


def route_keys(
    keys: torch.Tensor,
    world_size: int,
    dist_type: str = "roundrobin",
    num_embeddings: int | None = None,
) -> torch.Tensor:
    """Owning rank of each key of one table.

    Args:
        keys (torch.Tensor): int64 raw keys, any shape, CPU or CUDA.
        world_size (int): ranks the table is sharded over.
        dist_type (str): one of ``DIST_TYPES``. Defaults to ``"roundrobin"``.
        num_embeddings (Optional[int]): the table's declared rows; required
            for ``"continuous"``.

    Returns:
        torch.Tensor: int64 ranks, shaped like ``keys``.

    Raises:
        ValueError: an unknown ``dist_type``, a bad ``world_size``, or
            ``"continuous"`` without a positive ``num_embeddings``.
        TypeError: ``keys`` is not an int64 tensor.

    Example::

        ranks = route_keys(torch.tensor([5, -3, 12]), 4, "hash_roundrobin")
    """
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64:
        raise TypeError(f"keys must be an int64 tensor, got {getattr(keys, 'dtype', type(keys))}")
    code = dist_type_code(dist_type)
    if not is_int(world_size) or world_size <= 0:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    world_size = int(world_size)
    if code == DIST_TYPE_CODES["continuous"]:
        if num_embeddings is None:
            raise ValueError("dist_type 'continuous' needs num_embeddings")
        block = continuous_block_size(num_embeddings, world_size)
    else:
        block = 1
    flat = keys.reshape(-1).contiguous()
    ranks = route_keys_by_feature(
        flat,
        torch.zeros_like(flat),
        torch.tensor([code], dtype=torch.int64, device=keys.device),
        torch.tensor([block], dtype=torch.int64, device=keys.device),
        world_size,
    )
    return ranks.reshape(keys.shape)


def route_codes(dist_types: Sequence[str]) -> torch.Tensor:
    """``dist_types`` as a CPU int64 tensor of ``DIST_TYPE_CODES``."""
    return torch.tensor([dist_type_code(d) for d in dist_types], dtype=torch.int64)

"""Input distribution of row-wise sharded dynamic tables, and index dedup.

``bucketize_by_route`` splits a KeyedJaggedTensor into one bucket per rank by
the tables' routing (``dynamicemb.shard.routing``), keeping every key raw;
``DynamicEmbRwSparseFeaturesDist`` sends the buckets with TorchRec's
``KJTAllToAll``. ``dedup_kjt`` removes repeated keys per feature before the
all-to-all and returns the index that expands the looked-up rows again.
"""

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..embedding.unique import segmented_unique
from .routing import continuous_block_size, route_codes, route_keys_by_feature

__all__ = [
    "DynamicEmbRwSparseFeaturesDist",
    "bucketize_by_route",
    "dedup_kjt",
]


def _bag_ids(kjt: KeyedJaggedTensor) -> torch.Tensor:
    """Bag (feature * stride + sample) of every value, without a host sync."""
    lengths = kjt.lengths().long()
    values = kjt.values()
    return torch.repeat_interleave(
        torch.arange(lengths.numel(), device=values.device),
        lengths,
        output_size=values.numel(),
    )


def bucketize_by_route(
    kjt: KeyedJaggedTensor,
    world_size: int,
    dist_types: torch.Tensor,
    blocks: torch.Tensor,
    output_permute: bool = False,
) -> tuple[KeyedJaggedTensor, torch.Tensor | None]:
    """Orders a KJT's values by owning rank, one bucket of all features per rank.

    The result has the layout TorchRec's ``KJTAllToAll`` sends (as from
    ``bucketize_kjt_before_all2all``): keys repeated ``world_size`` times,
    lengths ``(world_size, num_features, stride)``; within a bag the values
    keep their order. Values stay raw keys; weights travel with their values.

    Args:
        kjt (KeyedJaggedTensor): features with one stride (no variable batch).
        world_size (int): number of buckets (ranks).
        dist_types (torch.Tensor): (num_features) int64 routing codes.
        blocks (torch.Tensor): (num_features) int64 continuous block sizes.
        output_permute (bool): also return, for each input value, its position
            in the bucketized values (what the sequence output dist reorders
            the returned embeddings with).

    Returns:
        Tuple[KeyedJaggedTensor, Optional[torch.Tensor]]: the bucketized KJT
        and the permute (None unless ``output_permute`` and ``world_size`` >
        1: with one rank the KJT is returned as it is, in its own order).

    Raises:
        NotImplementedError: ``kjt`` has a variable stride per feature.
    """
    if kjt.variable_stride_per_key():
        raise NotImplementedError(
            "dynamic embedding tables do not support variable batch size per feature"
        )
    with record_function("dynamicemb:routing"):
        return _bucketize(kjt, world_size, dist_types, blocks, output_permute)


def _bucketize(kjt, world_size, dist_types, blocks, output_permute):
    if world_size == 1:
        # One bucket: the KJT as it is (its values are already in bag order).
        return kjt, None
    num_features = len(kjt.keys())
    stride = kjt.stride()
    values = kjt.values()
    weights = kjt.weights_or_none()
    num_bags = num_features * stride
    bags = _bag_ids(kjt)
    features = torch.div(bags, max(stride, 1), rounding_mode="floor")
    ranks = route_keys_by_feature(values.long(), features, dist_types, blocks, world_size)
    # Bucket-major, then bag, then original position: the values are in bag
    # order already, so a stable sort by rank (16 bits: two radix passes) is enough.
    narrow = torch.int16 if world_size <= 2**15 else torch.int32
    order = torch.sort(ranks.to(narrow), stable=True).indices
    slot = ranks[order] * num_bags + bags[order]  # non-decreasing
    # Values per (rank, bag), from the sorted slots (no count read on the host).
    starts = torch.searchsorted(slot, torch.arange(world_size * num_bags + 1, device=slot.device))
    lengths = (starts[1:] - starts[:-1]).to(kjt.lengths().dtype)
    bucketized = KeyedJaggedTensor(
        keys=list(kjt.keys()) * world_size,
        values=values[order],
        weights=None if weights is None else weights[order],
        lengths=lengths,
        stride=stride,
    )
    permute = None
    if output_permute:
        permute = torch.empty_like(order)
        permute[order] = torch.arange(order.numel(), device=order.device)
    return bucketized, permute


class DynamicEmbRwSparseFeaturesDist(RwSparseFeaturesDist):
    """Row-wise input distribution of dynamic tables.

    A TorchRec ``RwSparseFeaturesDist`` (so the sharded modules treat it as
    one: its ``unbucketize_permute_tensor`` reorders sequence embeddings)
    whose bucketization follows each feature's ``dist_type`` and keeps raw
    keys.

    Args:
        pg (dist.ProcessGroup): the sharding's process group.
        feature_hash_sizes (Sequence[int]): ``num_embeddings`` of each
            feature's table.
        feature_dist_types (Sequence[str]): ``dist_type`` of each feature's
            table.
        device (Optional[torch.device]): where the routing tables live.
        is_sequence (bool): EmbeddingCollection (keep the permute) or
            EmbeddingBagCollection.

    Raises:
        ValueError: the lists differ in length, or a dist type or hash size is
            bad.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        feature_hash_sizes: Sequence[int],
        feature_dist_types: Sequence[str],
        device: torch.device | None = None,
        is_sequence: bool = False,
    ) -> None:
        if len(feature_hash_sizes) != len(feature_dist_types):
            raise ValueError(
                f"{len(feature_hash_sizes)} feature hash sizes for "
                f"{len(feature_dist_types)} feature dist types"
            )
        super().__init__(
            pg=pg,
            num_features=len(feature_hash_sizes),
            feature_hash_sizes=list(feature_hash_sizes),
            device=device,
            is_sequence=is_sequence,
        )
        world_size = pg.size()
        blocks = [continuous_block_size(int(h), world_size) for h in feature_hash_sizes]
        self.register_buffer(
            "_route_dist_types",
            route_codes(feature_dist_types).to(device),
            persistent=False,
        )
        self.register_buffer(
            "_route_blocks",
            torch.tensor(blocks, dtype=torch.int64, device=device),
            persistent=False,
        )

    def forward(self, sparse_features: KeyedJaggedTensor):
        """Bucketizes by route and starts the all-to-all.

        Returns:
            Awaitable[Awaitable[KeyedJaggedTensor]]: the features each rank
            looks up.
        """
        bucketized, self.unbucketize_permute_tensor = bucketize_by_route(
            sparse_features,
            self._world_size,
            self._route_dist_types,
            self._route_blocks,
            output_permute=self._is_sequence,
        )
        return self._dist(bucketized)


def dedup_kjt(
    kjt: KeyedJaggedTensor, counts_as_weights: bool = False
) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """Keeps the first occurrence of every (feature, key) of a KJT.

    The result is a sub-KJT of ``kjt`` (same keys and stride, values in their
    order), so the rows looked up for it, indexed by the returned inverse,
    are the rows of ``kjt``'s values.

    Args:
        kjt (KeyedJaggedTensor): features with one stride.
        counts_as_weights (bool): give every kept key a weight: the sum of its
            occurrences' weights, or its number of occurrences when ``kjt``
            has none (frequency counters for LFU scores, so they count the
            same with and without dedup). When False, weights (if any) are
            summed the same way.

    Returns:
        Tuple[KeyedJaggedTensor, torch.Tensor]: the deduplicated KJT and the
        (n) int64 position of each original value in it.

    Raises:
        NotImplementedError: ``kjt`` has a variable stride per feature.
    """
    if kjt.variable_stride_per_key():
        raise NotImplementedError(
            "index dedup of dynamic embedding tables does not support variable batch "
            "size per feature"
        )
    with record_function("dynamicemb:dedup"):
        return _dedup(kjt, counts_as_weights)


def _dedup(kjt: KeyedJaggedTensor, counts_as_weights: bool):
    values = kjt.values().long()
    n = values.numel()
    device = values.device
    stride = kjt.stride()
    num_features = len(kjt.keys())
    bags = _bag_ids(kjt)
    features = torch.div(bags, max(stride, 1), rounding_mode="floor")
    # The distinct (feature, key) pairs; their number sizes the KJT the
    # all-to-all sends (one read on the host, as any dedup before it).
    su = segmented_unique(values, features, max(num_features, 1))
    starts = torch.cumsum(su.counts, 0) - su.counts
    first = su.order[starts]  # each pair's first position (the sort is stable)
    kept, rank = torch.sort(first)  # kept positions in input order; pair of each
    new_position = torch.empty(n, dtype=torch.int64, device=device)
    new_position[kept] = torch.arange(kept.numel(), device=device)
    reverse = new_position[first[su.inverse]]
    kept_bags = bags[kept]  # non-decreasing
    offsets = torch.searchsorted(kept_bags, torch.arange(kjt.lengths().numel() + 1, device=device))
    weights = kjt.weights_or_none()
    kept_weights = None
    if weights is not None and n:
        # Summed per pair over its occurrences (in sorted order: no atomics).
        summed = torch.segment_reduce(weights.float()[su.order], "sum", lengths=su.counts)
        kept_weights = summed[rank]
    elif weights is not None or counts_as_weights:
        kept_weights = su.counts[rank].float()
    deduped = KeyedJaggedTensor(
        keys=kjt.keys(),
        values=kjt.values()[kept],
        weights=kept_weights,
        lengths=(offsets[1:] - offsets[:-1]).to(kjt.lengths().dtype),
        stride=stride,
    )
    return deduped, reverse

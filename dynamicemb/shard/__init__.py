"""TorchRec sharders for dynamic embedding tables.

``DynamicEmbeddingCollectionSharder`` and
``DynamicEmbeddingBagCollectionSharder`` are TorchRec's
``EmbeddingCollectionSharder`` / ``EmbeddingBagCollectionSharder``, used the
same way. A table whose plan entry is a ``DynamicEmbParameterSharding`` is
sharded row-wise into per-rank hash tables (``BatchedDynamicEmbeddingTablesV2``)
with keys routed by its ``dist_type`` (``route_keys``); the other tables of the
collection stay TorchRec's. ``plan_and_shard`` plans a model over the ranks
and shards it with ``DistributedModelParallel`` in one call.

Importing this package needs TorchRec (``import dynamicemb`` does not).
"""

from .embedding import (
    DYNAMICEMB_SHARDING_KEY,
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
    ShardedDynamicEmbeddingBagCollection,
    ShardedDynamicEmbeddingCollection,
)
from .input_dist import DynamicEmbRwSparseFeaturesDist, bucketize_by_route, dedup_kjt
from .lookup import (
    DynamicEmbeddingKernel,
    dynamic_embedding_kernels,
    named_dynamic_embedding_kernels,
)
from .model_parallel import plan_and_shard
from .routing import DIST_TYPE_CODES, continuous_block_size, route_keys

__all__ = [
    "DIST_TYPE_CODES",
    "DYNAMICEMB_SHARDING_KEY",
    "DynamicEmbRwSparseFeaturesDist",
    "DynamicEmbeddingBagCollectionSharder",
    "DynamicEmbeddingCollectionSharder",
    "DynamicEmbeddingKernel",
    "ShardedDynamicEmbeddingBagCollection",
    "ShardedDynamicEmbeddingCollection",
    "bucketize_by_route",
    "continuous_block_size",
    "dedup_kjt",
    "dynamic_embedding_kernels",
    "named_dynamic_embedding_kernels",
    "plan_and_shard",
    "route_keys",
]

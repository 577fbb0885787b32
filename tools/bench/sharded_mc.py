"""TorchRec's managed-collision tables, the baselines of tools/bench/sharded_ec_bench.py
that a user whose ids are unbounded picks instead of a static table sized to them.

A managed-collision collection (``ManagedCollisionEmbeddingCollection`` or
``ManagedCollisionEmbeddingBagCollection``) puts a module per table before
TorchRec's own tables: it remaps each raw id to a row of a table of fixed size
(``zch_size``, here the rows of the dynamic table it is compared with), keeps
the ids it holds and evicts by its own policy. Two kinds:

* ``mch``: ``MCHManagedCollisionModule`` with an eviction policy
  (``DistanceLFU_EvictionPolicy`` or ``LRU_EvictionPolicy``): a sorted buffer of
  the ids held, searched for each id; the ids of the last
  ``eviction_interval`` steps are merged in at the end of the interval (the
  lowest scored held ids evicted for them, their rows reset), an id not yet
  merged is remapped to the table's last row;
* ``zch``: ``HashZchManagedCollisionModule`` (multi-probe zero-collision
  hash: FBGEMM's ``zero_collision_hash`` finds or inserts each id in a probe
  range of its slots) with LRU eviction within the probe range.

Both are sharded by TorchRec's ``ManagedCollisionEmbeddingCollectionSharder``
(or its EBC twin) through DistributedModelParallel, row-wise (the only sharding
TorchRec's managed-collision sharder offers) with the FUSED kernel; their input
range is the ids' (``input_hash_size``), split over the ranks.
"""

import torch

MC_KINDS = ("mch", "zch")
MCH_POLICIES = ("distance_lfu", "lru")
# What the sharded collection's compute runs in (the remap and, inside it,
# the embedding lookup: TorchRec's record_function name).
MC_RANGE = "## compute:mcc ##"


def unavailable(kind: str, collection: str, device_type: str, world_size: int, rows: int):
    """Why ``kind`` cannot be timed here, or None when it can."""
    if kind == "zch":
        try:
            import torchrec.modules.hash_mc_modules  # noqa: F401
        except ImportError:
            return "this TorchRec has no HashZchManagedCollisionModule"
        if device_type == "cpu":
            return "FBGEMM's CPU kernel of zero_collision_hash only looks ids up (no insert)"
        if rows % world_size:
            return f"its buckets split {rows:,} rows evenly over the ranks, {world_size} do not"
    if collection == "ebc" and device_type == "cpu":
        return (
            "TorchRec's EmbeddingBagCollectionSharder shards row_wise (the only sharding of "
            "managed-collision tables) on CUDA only"
        )
    return None


def _module(kind: str, config, args, world_size: int, device: torch.device):
    """The managed-collision module of one table (``config``)."""
    if kind == "mch":
        from torchrec.modules.mc_modules import (
            DistanceLFU_EvictionPolicy,
            LRU_EvictionPolicy,
            MCHManagedCollisionModule,
        )

        lfu = args.mch_policy == "distance_lfu"
        policy = DistanceLFU_EvictionPolicy if lfu else LRU_EvictionPolicy
        return MCHManagedCollisionModule(
            zch_size=config.num_embeddings,
            device=device,
            eviction_policy=policy(),
            eviction_interval=args.mc_eviction_interval,
            input_hash_size=args.id_space,
            buckets=world_size,  # TorchRec's planner shards a whole number of buckets per rank
        )
    from torchrec.modules.hash_mc_evictions import (
        HashZchEvictionConfig,
        HashZchEvictionPolicyName,
    )
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

    return HashZchManagedCollisionModule(
        zch_size=config.num_embeddings,
        device=device,
        total_num_buckets=world_size,
        input_hash_size=args.id_space,
        name=config.name,
        eviction_policy_name=HashZchEvictionPolicyName.LRU_EVICTION,
        # LRU's scorer stamps each id with the hour it was seen plus this TTL.
        eviction_config=HashZchEvictionConfig(features=config.feature_names, single_ttl=1),
    )


def wrap(kind: str, collection: torch.nn.Module, configs, args, world_size: int, device):
    """``collection`` (an EmbeddingCollection or EmbeddingBagCollection of
    ``configs``) behind a managed-collision module of ``kind`` per table."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.mc_embedding_modules import (
        ManagedCollisionEmbeddingBagCollection,
        ManagedCollisionEmbeddingCollection,
    )
    from torchrec.modules.mc_modules import ManagedCollisionCollection

    mcc = ManagedCollisionCollection(
        managed_collision_modules={
            c.name: _module(kind, c, args, world_size, device) for c in configs
        },
        embedding_configs=configs,
    )
    if isinstance(collection, EmbeddingBagCollection):
        return ManagedCollisionEmbeddingBagCollection(collection, mcc)
    return ManagedCollisionEmbeddingCollection(collection, mcc)


def sharder(collection: str, params: dict):
    """TorchRec's managed-collision sharder, its tables' fused optimizer ``params``."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder
    from torchrec.distributed.mc_embeddingbag import (
        ManagedCollisionEmbeddingBagCollectionSharder,
    )

    if collection == "ebc":
        return ManagedCollisionEmbeddingBagCollectionSharder(
            EmbeddingBagCollectionSharder(fused_params=params)
        )
    return ManagedCollisionEmbeddingCollectionSharder(
        EmbeddingCollectionSharder(fused_params=params)
    )


def constraints(configs) -> dict:
    """Row-wise with the FUSED kernel (the managed-collision sharder's only
    sharding; its kernel list also names caching kernels the planner's
    estimator does not cost on the CPU)."""
    from torchrec.distributed.planner.types import ParameterConstraints

    return {
        c.name: ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["fused"])
        for c in configs
    }


def rows_held(model) -> int:
    """Ids this rank's managed-collision modules hold (all tables)."""
    from torchrec.modules.mc_modules import MCHManagedCollisionModule

    held = 0
    for m in model.modules():
        if isinstance(m, MCHManagedCollisionModule):
            held += int((m._mch_sorted_raw_ids != torch.iinfo(torch.int64).max).sum())
        elif type(m).__name__ == "HashZchManagedCollisionModule":
            held += int((m._hash_zch_identities != -1).sum())
    return held

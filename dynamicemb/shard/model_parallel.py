"""A model planned over the ranks of a process group and sharded with
TorchRec's ``DistributedModelParallel``: the step between building a model
and training it, in one call."""

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ModuleSharder, ShardingEnv, ShardingPlan

from .._checks import device_of
from ..planner import DynamicEmbeddingShardingPlanner

__all__ = ["plan_and_shard"]


def plan_and_shard(
    model: nn.Module,
    planner: DynamicEmbeddingShardingPlanner,
    sharders: Sequence[ModuleSharder[nn.Module]],
    device: torch.device | str,
    pg: dist.ProcessGroup | None = None,
) -> tuple[DistributedModelParallel, ShardingPlan]:
    """Plans ``model`` over the ranks of ``pg`` and shards it.

    Every rank of ``pg`` calls it with the same model and planner. Rank 0
    makes the plan (``planner.collective_plan``) and every rank receives it;
    then ``DistributedModelParallel`` shards the model by it with
    ``sharders``: the dynamic tables become per-rank hash tables, the other
    tables stay TorchRec's, and the rest of the model is data parallel.

    The arguments are checked on each rank before any collective, so a bad
    call fails alike on every rank instead of leaving some inside the
    planner's broadcast.

    Args:
        model (nn.Module): the unsharded model; its embedding collections
            may be on the meta device (their tables are created sharded).
        planner (DynamicEmbeddingShardingPlanner): the planner of the
            model's tables; its topology must have ``pg``'s world size and
            ``device``'s type.
        sharders (Sequence[ModuleSharder[nn.Module]]): the sharders, one per
            kind of embedding module in the model (for example
            ``DynamicEmbeddingBagCollectionSharder(fused_params=...)``).
        device (Union[torch.device, str]): this rank's device (``"cuda"`` is
            the current CUDA device).
        pg (Optional[dist.ProcessGroup]): the ranks to shard over. Default:
            the default process group. In a group other than the world the
            dynamic tables shard over the group's ranks; TorchRec's own
            sharded tensors (the static tables) place shards by global rank,
            and TorchRec refuses them where the group's ranks are not the
            world's first ones ("Global rank ... does not exist in input
            process group").

    Returns:
        Tuple[DistributedModelParallel, ShardingPlan]: the sharded model and
        the plan (dynamic tables' entries are ``DynamicEmbParameterSharding``,
        with the options each rank's table was built with).

    Raises:
        TypeError: ``planner`` is not a ``DynamicEmbeddingShardingPlanner``,
            or ``sharders`` is not a sequence of ``ModuleSharder``.
        ValueError: ``sharders`` is empty, or the planner's topology is of
            another world size than ``pg`` or another device type than
            ``device``.
        RuntimeError: ``pg`` is None and ``torch.distributed`` has no default
            process group.

    Example::

        import torch
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.distributed.planner import Topology
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        from dynamicemb import DynamicEmbTableOptions
        from dynamicemb.planner import (
            DynamicEmbeddingShardingPlanner,
            DynamicEmbParameterConstraints,
        )
        from dynamicemb.shard import DynamicEmbeddingBagCollectionSharder, plan_and_shard

        # Every rank, after torch.distributed.init_process_group(...):
        configs = [EmbeddingBagConfig(name="user", embedding_dim=16,
                                      num_embeddings=1 << 20, feature_names=["u"])]
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        planner = DynamicEmbeddingShardingPlanner(
            eb_configs=configs,
            topology=Topology(world_size=torch.distributed.get_world_size(),
                              compute_device="cuda"),
            constraints={"user": DynamicEmbParameterConstraints(
                sharding_types=["row_wise"], use_dynamicemb=True,
                dynamicemb_options=DynamicEmbTableOptions())},
        )
        sharder = DynamicEmbeddingBagCollectionSharder(
            fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1})
        model, plan = plan_and_shard(ebc, planner, [sharder], "cuda")
    """
    if not isinstance(planner, DynamicEmbeddingShardingPlanner):
        raise TypeError(
            f"planner must be a DynamicEmbeddingShardingPlanner, got {type(planner).__name__}"
        )
    sharders = _sharder_list(sharders)
    device = device_of(device)
    if pg is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "plan_and_shard needs a process group: call "
                "torch.distributed.init_process_group first, or pass pg"
            )
        pg = dist.group.WORLD
    topology = planner.topology
    world_size = dist.get_world_size(pg)
    if topology.world_size != world_size:
        raise ValueError(
            f"the planner's topology has world size {topology.world_size}, the process group "
            f"{world_size} ranks"
        )
    if topology.compute_device != device.type:
        raise ValueError(
            f"the planner's topology computes on {topology.compute_device!r}, the model is to "
            f"be sharded on {device}"
        )
    plan = planner.collective_plan(model, sharders, pg)
    sharded = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=sharders,
    )
    return sharded, plan


def _sharder_list(sharders: Any) -> list[ModuleSharder[nn.Module]]:
    """``sharders`` as a list, each entry checked."""
    if isinstance(sharders, ModuleSharder) or not isinstance(sharders, Sequence):
        raise TypeError(
            f"sharders must be a sequence of ModuleSharder, got {type(sharders).__name__}"
        )
    if not sharders:
        raise ValueError("sharders must name at least one ModuleSharder, got an empty sequence")
    for i, sharder in enumerate(sharders):
        if not isinstance(sharder, ModuleSharder):
            raise TypeError(f"sharders[{i}] must be a ModuleSharder, got {type(sharder).__name__}")
    return list(sharders)

"""A TorchRec ``Topology`` built the way the installed TorchRec wants it.

TorchRec 1.8 and later warn, for every ``Topology`` built directly, that it
should come from ``TopologyFactory.create_topology`` ("otherwise, the job will
fail"). ``topology`` builds it through the factory where TorchRec has one, and
directly where it does not, from the few facts a job knows: ranks, ranks per
host, the compute device and, optionally, memory per rank. The planner's
default topology is built by it.
"""

from typing import Any

from torchrec.distributed.planner.types import Topology

__all__ = ["topology"]


def topology(
    world_size: int,
    compute_device: str,
    local_world_size: int | None = None,
    hbm_cap: int | None = None,
    ddr_cap: int | None = None,
) -> Topology:
    """TorchRec's ``Topology`` of ``world_size`` ranks.

    Args:
        world_size (int): ranks of the sharding.
        compute_device (str): ``"cuda"`` or ``"cpu"`` (``torch.device.type``).
        local_world_size (Optional[int]): ranks per host. Default: all.
        hbm_cap (Optional[int]): device memory per rank in bytes (TorchRec's
            default when None). The budget of TorchRec's tables; the dynamic
            tables take theirs from their options.
        ddr_cap (Optional[int]): host memory per rank in bytes (TorchRec's
            default when None).

    Returns:
        Topology: built by ``TopologyFactory.create_topology`` where the
        installed TorchRec has it (no warning), else by ``Topology``.

    Example::

        from dynamicemb.planner import DynamicEmbeddingShardingPlanner, topology

        planner = DynamicEmbeddingShardingPlanner(
            eb_configs=configs,
            topology=topology(world_size=8, compute_device="cuda", local_world_size=8),
            constraints=constraints,
        )
    """
    local = world_size if local_world_size is None else local_world_size
    try:
        from torchrec.distributed.planner.types import (
            KernelConfig,
            TopologyFactory,
            TrainerConfig,
        )
    except ImportError:
        kwargs: dict[str, Any] = {}
        if hbm_cap is not None:
            kwargs["hbm_cap"] = hbm_cap
        if ddr_cap is not None:
            kwargs["ddr_cap"] = ddr_cap
        return Topology(
            world_size=world_size, compute_device=compute_device, local_world_size=local, **kwargs
        )
    trainer = TrainerConfig(
        world_size=world_size,
        local_world_size=local,
        hbm_cap_bytes=hbm_cap,
        ddr_cap_bytes=ddr_cap,
    )
    return TopologyFactory.create_topology(
        trainer_config=trainer, kernel_config=KernelConfig(compute_device=compute_device)
    )

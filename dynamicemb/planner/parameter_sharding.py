"""How a sharding plan marks a table as a dynamic embedding table.

The planner (``DynamicEmbeddingShardingPlanner``) and the sharders
(``dynamicemb.shard``) meet here and nowhere else:

* a dynamic table is planned row-wise with TorchRec's
  ``EmbeddingComputeKernel.CUSTOMIZED_KERNEL`` as its compute kernel, so
  TorchRec's own kernels never claim it and its estimators can be told apart;
* its ``ParameterSharding`` in the plan is a ``DynamicEmbParameterSharding``
  that carries the per-rank ``DynamicEmbTableOptions`` the planner prepared
  (dim, max_capacity, bucket_capacity, init_capacity, local_hbm_for_values,
  completed initializer bounds, dist_type). The sharders build the tables from
  those options and read nothing else about them.
"""

from dataclasses import dataclass, field

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ParameterSharding, ShardingType

from ..dynamicemb_config import DynamicEmbTableOptions

__all__ = [
    "DYNAMICEMB_COMPUTE_KERNEL",
    "DYNAMICEMB_SHARDING_TYPE",
    "DynamicEmbParameterSharding",
    "is_dynamicemb_sharding",
]

DYNAMICEMB_COMPUTE_KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
DYNAMICEMB_SHARDING_TYPE = ShardingType.ROW_WISE.value


@dataclass
class DynamicEmbParameterSharding(ParameterSharding):
    """A ``ParameterSharding`` for a dynamic table, with its per-rank options.

    Attributes:
        dynamicemb_options (DynamicEmbTableOptions): the table's options as the
            planner prepared them for one rank of the plan's world size.
    """

    dynamicemb_options: DynamicEmbTableOptions = field(
        default_factory=DynamicEmbTableOptions
    )


def is_dynamicemb_sharding(parameter_sharding: ParameterSharding) -> bool:
    """True when ``parameter_sharding`` places a dynamic embedding table."""
    return isinstance(parameter_sharding, DynamicEmbParameterSharding)

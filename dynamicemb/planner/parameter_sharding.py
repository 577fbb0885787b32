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
  those options and read nothing else about them;
* a dynamic table's initializer id (``initializer_table_ids``) is its
  position among the dynamic tables of its collection, in the collection's
  config order: the sharders give each table that id whatever module it is
  fused into, and ``construct_twin_module`` writes the twin's rows with it.
"""

from collections.abc import Sequence, Set
from dataclasses import dataclass, field

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ParameterSharding, ShardingType

from ..dynamicemb_config import DynamicEmbTableOptions

__all__ = [
    "DYNAMICEMB_COMPUTE_KERNEL",
    "DYNAMICEMB_SHARDING_TYPE",
    "DynamicEmbParameterSharding",
    "initializer_table_ids",
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

    dynamicemb_options: DynamicEmbTableOptions = field(default_factory=DynamicEmbTableOptions)


def is_dynamicemb_sharding(parameter_sharding: ParameterSharding) -> bool:
    """True when ``parameter_sharding`` places a dynamic embedding table."""
    return isinstance(parameter_sharding, DynamicEmbParameterSharding)


def initializer_table_ids(table_names: Sequence[str], dynamic_names: Set[str]) -> dict[str, int]:
    """The initializer table id of each dynamic table of one collection.

    A dynamic table creates a key's first row from (seed, table id, key), so
    the id has to be the same wherever the table lives: it is the table's
    position among the collection's dynamic tables, in the collection's
    config order. It does not depend on the world size, on how TorchRec
    groups tables into modules (pooling, options), nor on routing.

    Args:
        table_names (Sequence[str]): the collection's table names in config
            order (``embedding_configs()`` / ``embedding_bag_configs()``).
        dynamic_names (Set[str]): the names of its dynamic tables.

    Returns:
        Dict[str, int]: dynamic table name -> id (0, 1, ... in config order).

    Raises:
        ValueError: a name is repeated in ``table_names``, or a dynamic name
            is not one of them.
    """
    seen = set()
    for name in table_names:
        if name in seen:
            raise ValueError(f"table {name!r} appears twice in the collection's configs")
        seen.add(name)
    unknown = sorted(set(dynamic_names) - seen)
    if unknown:
        raise ValueError(
            f"dynamic tables {unknown} are not tables of the collection {list(table_names)}"
        )
    ids: dict[str, int] = {}
    for name in table_names:
        if name in dynamic_names:
            ids[name] = len(ids)
    return ids

"""Row-wise embedding shardings of dynamic tables.

TorchRec's row-wise shardings (``RwSequenceEmbeddingSharding`` for an
EmbeddingCollection, ``RwPooledEmbeddingSharding`` for an
EmbeddingBagCollection) with two parts replaced: the input dist routes raw keys
by each table's ``dist_type`` (``DynamicEmbRwSparseFeaturesDist``), and the
lookup is a ``DynamicEmbeddingKernel`` per group. The output dists (sequence
all-to-all, pooled reduce-scatter) are TorchRec's, so gradients reach the
tables exactly as they reach TorchRec's own (divided by the world size when
``get_gradient_division()`` is on).
"""

import dataclasses
from typing import Any

import torch
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingEnv, ShardingType

from ..dynamicemb_config import DynamicEmbTableOptions
from ..planner.parameter_sharding import is_dynamicemb_sharding
from .input_dist import DynamicEmbRwSparseFeaturesDist
from .lookup import (
    GROUP_KEY,
    DynamicEmbGroupedEmbeddingsLookup,
    DynamicEmbGroupedPooledEmbeddingsLookup,
)

__all__ = [
    "DynamicEmbRwPooledEmbeddingSharding",
    "DynamicEmbRwSequenceEmbeddingSharding",
    "prepare_dynamic_sharding_infos",
]


def prepare_dynamic_sharding_infos(
    sharding_infos: list[EmbeddingShardingInfo],
) -> list[EmbeddingShardingInfo]:
    """Checks the dynamic tables of a sharding and marks which may be fused.

    Every table must be planned by a ``DynamicEmbParameterSharding`` with
    sharding type ROW_WISE and compute kernel CUSTOMIZED_KERNEL. Tables whose
    options disagree on what one fused module shares
    (``DynamicEmbTableOptions.get_grouped_key``) get different
    ``dynamicemb_group`` entries in their fused_params, so TorchRec's
    ``group_tables`` puts them in different groups (and modules).

    Returns:
        List[EmbeddingShardingInfo]: copies of the infos with the entry added.

    Raises:
        ValueError: a table is not planned as a dynamic row-wise table, or
            has a feature processor.
    """
    prepared: list[EmbeddingShardingInfo] = []
    group_of: dict[tuple[Any, ...], int] = {}
    for info in sharding_infos:
        name = info.embedding_config.name
        ps = info.param_sharding
        if not is_dynamicemb_sharding(ps):
            raise ValueError(
                f"table {name!r} is in a dynamic embedding sharding but its plan entry is a "
                f"{type(ps).__name__}, not a DynamicEmbParameterSharding"
            )
        if ps.sharding_type != ShardingType.ROW_WISE.value:
            raise ValueError(
                f"dynamic table {name!r} must be sharded {ShardingType.ROW_WISE.value!r}, "
                f"got {ps.sharding_type!r}"
            )
        if ps.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value:
            raise ValueError(
                f"dynamic table {name!r} must use compute kernel "
                f"{EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value!r}, got {ps.compute_kernel!r}"
            )
        options = ps.dynamicemb_options
        if not isinstance(options, DynamicEmbTableOptions):
            raise TypeError(
                f"table {name!r}: dynamicemb_options must be a DynamicEmbTableOptions, "
                f"got {type(options).__name__}"
            )
        if info.embedding_config.has_feature_processor:
            raise ValueError(f"dynamic table {name!r}: feature processors are not supported")
        # dist_type is left out: routing happens before the lookup, so it
        # does not have to split modules. (Initializer ids do not depend on
        # the grouping: see initializer_table_ids.)
        fuse_key = tuple(kv for kv in options.get_grouped_key() if kv[0] != "dist_type")
        group = group_of.setdefault(fuse_key, len(group_of))
        fused_params = dict(info.fused_params or {})
        fused_params[GROUP_KEY] = group
        prepared.append(dataclasses.replace(info, fused_params=fused_params))
    return prepared


class _DynamicEmbRwMixin:
    """What both row-wise dynamic shardings add to TorchRec's.

    Each class says whether its input dist is a sequence one
    (``_IS_SEQUENCE``).

    Args:
        sharding_infos (List[EmbeddingShardingInfo]): the dynamic tables.
        env (ShardingEnv): the sharding environment.
        device (Optional[torch.device]): the compute device.
        qcomm_codecs_registry: as for TorchRec's shardings.
    """

    _IS_SEQUENCE: bool

    def __init__(
        self,
        sharding_infos: list[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: torch.device | None = None,
        qcomm_codecs_registry: dict[str, Any] | None = None,
    ) -> None:
        sharding_infos = prepare_dynamic_sharding_infos(sharding_infos)
        super().__init__(
            sharding_infos=sharding_infos,
            env=env,
            device=device,
            qcomm_codecs_registry=qcomm_codecs_registry,
        )
        self._dynamicemb_table_options: dict[str, DynamicEmbTableOptions] = {
            info.embedding_config.name: info.param_sharding.dynamicemb_options
            for info in sharding_infos
        }
        # The sharded collection hands over all its dynamic tables, ordered
        # by initializer table id (position among the collection's dynamic
        # tables in config order), so the position here is the id.
        self._dynamicemb_table_ids: dict[str, int] = {
            info.embedding_config.name: i for i, info in enumerate(sharding_infos)
        }

    def _feature_dist_types(self) -> list[str]:
        dist_types: list[str] = []
        for group in self._grouped_embedding_configs:
            for table in group.embedding_tables:
                dist_type = self._dynamicemb_table_options[table.name].dist_type
                dist_types.extend([dist_type] * table.num_features())
        return dist_types

    def create_input_dist(
        self, device: torch.device | None = None
    ) -> DynamicEmbRwSparseFeaturesDist:
        return DynamicEmbRwSparseFeaturesDist(
            pg=self._pg,
            feature_hash_sizes=self._get_feature_hash_sizes(),
            feature_dist_types=self._feature_dist_types(),
            device=device if device is not None else self._device,
            is_sequence=self._IS_SEQUENCE,
        )

    def _dynamicemb_lookup_args(self, device: torch.device | None) -> dict[str, Any]:
        """The arguments both dynamic lookups take (their constructors' keywords)."""
        return dict(
            grouped_configs=self._grouped_embedding_configs,
            table_options=self._dynamicemb_table_options,
            table_ids=self._dynamicemb_table_ids,
            world_size=self._world_size,
            pg=self._pg,
            device=device if device is not None else self._device,
            env=self._env,
        )

    @property
    def dynamicemb_table_options(self) -> dict[str, DynamicEmbTableOptions]:
        """The plan's options of each table, by name."""
        return dict(self._dynamicemb_table_options)

    @property
    def dynamicemb_table_ids(self) -> dict[str, int]:
        """The initializer table id of each table, by name."""
        return dict(self._dynamicemb_table_ids)


class DynamicEmbRwSequenceEmbeddingSharding(_DynamicEmbRwMixin, RwSequenceEmbeddingSharding):
    """Row-wise sharding of an EmbeddingCollection's dynamic tables
    (arguments: ``_DynamicEmbRwMixin``)."""

    _IS_SEQUENCE = True

    def create_lookup(
        self,
        device: torch.device | None = None,
        fused_params: dict[str, Any] | None = None,
        feature_processor: Any | None = None,
    ) -> DynamicEmbGroupedEmbeddingsLookup:
        return DynamicEmbGroupedEmbeddingsLookup(**self._dynamicemb_lookup_args(device))


class DynamicEmbRwPooledEmbeddingSharding(_DynamicEmbRwMixin, RwPooledEmbeddingSharding):
    """Row-wise sharding of an EmbeddingBagCollection's dynamic tables
    (arguments: ``_DynamicEmbRwMixin``)."""

    _IS_SEQUENCE = False

    def create_lookup(
        self,
        device: torch.device | None = None,
        fused_params: dict[str, Any] | None = None,
        feature_processor: Any | None = None,
    ) -> DynamicEmbGroupedPooledEmbeddingsLookup:
        return DynamicEmbGroupedPooledEmbeddingsLookup(
            feature_processor=feature_processor,
            sharding_type=ShardingType.ROW_WISE,
            **self._dynamicemb_lookup_args(device),
        )

"""The per-rank lookup of row-wise sharded dynamic tables.

``DynamicEmbeddingKernel`` is a TorchRec ``BaseEmbedding`` (the role FBGEMM's
TBE plays for TorchRec's FUSED kernel) around one
``BatchedDynamicEmbeddingTablesV2`` for a group of tables. The grouped lookups
are TorchRec's own (``GroupedEmbeddingsLookup``,
``GroupedPooledEmbeddingsLookup``), with this kernel for the groups whose
compute kernel is ``CUSTOMIZED_KERNEL``.
"""

import dataclasses
import enum
from collections.abc import Iterator
from typing import Any

import torch
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_lookup import (
    GroupedEmbeddingsLookup,
    GroupedPooledEmbeddingsLookup,
)
from torchrec.distributed.embedding_types import (
    EmbeddingComputeKernel,
    GroupedEmbeddingConfig,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..dynamicemb_config import DynamicEmbPoolingMode, DynamicEmbTableOptions
from ..embedding import BatchedDynamicEmbeddingTablesV2, RowOptimizer
from ..planner.prepare import prepare_table_options

__all__ = [
    "DynamicEmbGroupedEmbeddingsLookup",
    "DynamicEmbGroupedPooledEmbeddingsLookup",
    "DynamicEmbeddingKernel",
    "optimizer_from_fused_params",
]

# fused_params entries that configure the fused row optimizer: RowOptimizer's
# fields; every other entry (TBE cache, precision, bounds-check settings, ...)
# concerns TorchRec's own kernels and is not read here.
_OPTIMIZER_ARGS = tuple(f.name for f in dataclasses.fields(RowOptimizer) if f.name != "optimizer")

# Seed of the tables' initializers: the same on every rank, so a key's first
# row does not depend on the rank that owns it.
_INITIALIZER_SEED = 0

# The grouping entry dynamicemb adds to a dynamic table's fused_params so that
# TorchRec's group_tables fuses only tables that can share one module.
GROUP_KEY = "dynamicemb_group"


def optimizer_from_fused_params(
    fused_params: dict[str, Any] | None,
) -> tuple[Any, dict[str, Any]]:
    """The fused optimizer type and its arguments from a sharder's fused_params.

    Args:
        fused_params (Optional[Dict[str, Any]]): as TorchRec hands them to a
            grouped kernel (``optimizer`` an ``EmbOptimType`` or
            ``DynamicEmbOptimType``, ``learning_rate``, ``eps``, ...).

    Returns:
        Tuple[Any, Dict[str, Any]]: the optimizer (None for the module's
        default, exact SGD) and the keyword arguments of
        ``BatchedDynamicEmbeddingTablesV2`` (enums such as
        ``weight_decay_mode`` become their int values).
    """
    params = dict(fused_params or {})
    args: dict[str, Any] = {}
    for name in _OPTIMIZER_ARGS:
        if params.get(name) is not None:
            value = params[name]
            args[name] = value.value if isinstance(value, enum.Enum) else value
    return params.get("optimizer"), args


class DynamicEmbeddingKernel(BaseEmbedding):
    """The lookup of one group of dynamic tables on one rank.

    Keys arrive raw (as routed by ``DynamicEmbRwSparseFeaturesDist``) and are
    looked up, inserted and updated in place by a fused
    ``BatchedDynamicEmbeddingTablesV2``; like TorchRec's FUSED kernel the
    optimizer runs in the backward pass, so the kernel has no dense weight.

    Args:
        config (GroupedEmbeddingConfig): the group TorchRec formed.
        table_options (Dict[str, DynamicEmbTableOptions]): options of each
            table, by name.
        table_ids (Dict[str, int]): the initializer table id of each table,
            by name (its position among its collection's dynamic tables, the
            same on every rank and in every group).
        pooling (DynamicEmbPoolingMode): NONE for an EmbeddingCollection; SUM
            for an EmbeddingBagCollection (row-wise MEAN is divided by the
            bag lengths after the output dist, as TorchRec does).
        world_size (int): ranks of the sharding.
        device (Optional[torch.device]): where the tables live.
    """

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        table_options: dict[str, DynamicEmbTableOptions],
        table_ids: dict[str, int],
        pooling: DynamicEmbPoolingMode,
        world_size: int,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        options: list[DynamicEmbTableOptions] = []
        feature_table_map: list[int] = []
        for t, table in enumerate(config.embedding_tables):
            if table.name not in table_options:
                raise ValueError(f"table {table.name!r} has no dynamicemb_options")
            if table.name not in table_ids:
                raise ValueError(f"table {table.name!r} has no initializer table id")
            options.append(prepare_table_options(table_options[table.name], table, world_size))
            feature_table_map.extend([t] * table.num_features())
        self._table_names: list[str] = [table.name for table in config.embedding_tables]
        self._initializer_table_ids: list[int] = [table_ids[name] for name in self._table_names]
        self._pooled = pooling != DynamicEmbPoolingMode.NONE
        optimizer, optimizer_args = optimizer_from_fused_params(config.fused_params)
        self._emb_module = BatchedDynamicEmbeddingTablesV2(
            options,
            feature_table_map=feature_table_map,
            pooling_mode=pooling,
            optimizer=optimizer,
            device=device,
            seed=_INITIALIZER_SEED,
            initializer_table_ids=self._initializer_table_ids,
            table_names=self._table_names,
            **optimizer_args,
        )
        # TorchRec's input distribution builds the offsets; the step reads
        # nothing back from the device (BatchedDynamicEmbeddingTablesV2.check_values).
        self._emb_module.check_values = False

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    @property
    def emb_module(self) -> BatchedDynamicEmbeddingTablesV2:
        """The fused tables of this group."""
        return self._emb_module

    @property
    def table_names(self) -> list[str]:
        """Names of the group's tables, in the module's table order."""
        return list(self._table_names)

    @property
    def initializer_table_ids(self) -> dict[str, int]:
        """The initializer table id of each of the group's tables, by name."""
        return dict(zip(self._table_names, self._initializer_table_ids))

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Looks up the routed features.

        KJT weights are pooling weights of a weighted EmbeddingBagCollection,
        frequency counters (LFU) of an EmbeddingCollection, and ignored on an
        unweighted EmbeddingBagCollection.

        Returns:
            torch.Tensor: (values, dim) for sequence lookups, (stride, sum of
            the features' dims) for pooled ones.
        """
        weights = features.weights_or_none()
        pooling_weights = frequency_counters = None
        if weights is not None:
            if not self._pooled:
                frequency_counters = weights
            elif self._config.is_weighted:
                pooling_weights = weights.float()
        return self._emb_module(
            features.values(),
            features.offsets(),
            frequency_counters=frequency_counters,
            pooling_weights=pooling_weights,
        )

    # The rows live in the hash table, not in a dense weight: nothing to add
    # to TorchRec's state dict or parameter views (DynamicEmbDump / Load
    # checkpoint them).
    def state_dict(
        self,
        destination: dict[str, Any] | None = None,
        prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:
        if destination is None:
            destination = {}
        return destination

    def named_parameters_by_table(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(())

    def named_split_embedding_weights(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return iter(())

    def prefetch(self, features: KeyedJaggedTensor, forward_stream: Any = None) -> None:
        """Brings the routed features' keys that the group's backing tier
        holds into its device cache (a no-op without a cache)."""
        self._emb_module.prefetch(features.values(), features.offsets(), forward_stream)

    def flush(self) -> None:
        """Writes the device cache back to the backing tier."""
        self._emb_module.flush()

    def purge(self) -> None:
        """Writes the device cache back and empties it."""
        self._emb_module.purge()


class _DynamicLookupMixin:
    """What both dynamic lookups add to TorchRec's grouped lookups: a
    ``DynamicEmbeddingKernel`` for each group, built with the tables'
    options, initializer ids and the sharding's world size, and a prefetch.

    Args:
        table_options (Dict[str, DynamicEmbTableOptions]): options by table.
        table_ids (Dict[str, int]): initializer table ids by table.
        world_size (int): ranks of the sharding.
        **lookup_args: the TorchRec parent's (``grouped_configs``, ``pg``,
            ``device``, ``env``, and for the pooled lookup
            ``feature_processor`` and ``sharding_type``).
    """

    _POOLING: DynamicEmbPoolingMode

    def __init__(
        self,
        *,
        table_options: dict[str, DynamicEmbTableOptions],
        table_ids: dict[str, int],
        world_size: int,
        **lookup_args: Any,
    ) -> None:
        # Read by _dynamic_kernel, which the parent's constructor calls
        # (before nn.Module's own attributes exist, hence object.__setattr__).
        object.__setattr__(self, "dynamicemb_table_options", dict(table_options))
        object.__setattr__(self, "dynamicemb_table_ids", dict(table_ids))
        object.__setattr__(self, "dynamicemb_world_size", world_size)
        super().__init__(**lookup_args)

    def _dynamic_kernel(
        self, config: GroupedEmbeddingConfig, device: torch.device | None
    ) -> DynamicEmbeddingKernel:
        if config.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            raise ValueError(
                "a dynamic embedding sharding holds only tables with compute kernel "
                f"{EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value!r}, got "
                f"{config.compute_kernel.value!r} for tables "
                f"{[t.name for t in config.embedding_tables]}"
            )
        return DynamicEmbeddingKernel(
            config,
            self.dynamicemb_table_options,
            self.dynamicemb_table_ids,
            self._POOLING,
            self.dynamicemb_world_size,
            device,
        )

    def prefetch(self, sparse_features: KeyedJaggedTensor, forward_stream: Any = None) -> None:
        """Each group's share of the features to its kernel's prefetch
        (TorchRec's sharded module calls it from its prefetch hook, which
        ``TrainPipelinePrefetch`` runs for the next batch)."""
        if not self._emb_modules:
            return
        for kernel, features in zip(self._emb_modules, sparse_features.split(self._feature_splits)):
            kernel.prefetch(features, forward_stream)


class DynamicEmbGroupedEmbeddingsLookup(_DynamicLookupMixin, GroupedEmbeddingsLookup):
    """TorchRec's sequence lookup with ``DynamicEmbeddingKernel`` groups
    (arguments: ``_DynamicLookupMixin``)."""

    _POOLING = DynamicEmbPoolingMode.NONE

    def _create_embedding_kernel(
        self, config: GroupedEmbeddingConfig, pg: Any, device: Any, *args: Any, **kwargs: Any
    ) -> BaseEmbedding:
        return self._dynamic_kernel(config, device)


class DynamicEmbGroupedPooledEmbeddingsLookup(_DynamicLookupMixin, GroupedPooledEmbeddingsLookup):
    """TorchRec's pooled lookup with ``DynamicEmbeddingKernel`` groups
    (arguments: ``_DynamicLookupMixin``)."""

    _POOLING = DynamicEmbPoolingMode.SUM

    def _create_embedding_kernel(
        self, config: GroupedEmbeddingConfig, device: Any, *args: Any, **kwargs: Any
    ) -> BaseEmbedding:
        return self._dynamic_kernel(config, device)


def named_dynamic_embedding_kernels(
    model: torch.nn.Module,
) -> list[tuple[str, "DynamicEmbeddingKernel"]]:
    """This rank's ``DynamicEmbeddingKernel`` of every group of dynamic tables
    in a sharded model, in module order, each with the name of its sharded
    collection: the collection's path in the model unwrapped from
    DistributedModelParallel, DistributedDataParallel and FSDP (e.g.
    ``"sparse_arch"``; ``""`` when the model is the collection).

    TorchRec's sharded collections keep their lookups (one per sharding) in a
    plain list, not as submodules, so ``model.modules()`` alone does not reach
    them; a lookup may be wrapped (e.g. by DistributedDataParallel). Each
    kernel's ``table_names`` and ``emb_module`` (a
    ``BatchedDynamicEmbeddingTablesV2``, whose ``rows`` checkpoints,
    replication and metrics read, through ``dynamicemb.shard.tables``) are
    what tests and examples read.
    """
    from torchrec.distributed.model_parallel import get_unwrapped_module

    kernels: list[tuple[str, DynamicEmbeddingKernel]] = []
    for name, module in get_unwrapped_module(model).named_modules():
        for lookup in getattr(module, "_lookups", None) or []:
            lookup = getattr(lookup, "module", lookup)
            kernels += [
                (name, m) for m in lookup.modules() if isinstance(m, DynamicEmbeddingKernel)
            ]
    return kernels


def dynamic_embedding_kernels(model: torch.nn.Module) -> list["DynamicEmbeddingKernel"]:
    """The kernels of ``named_dynamic_embedding_kernels``, without the names."""
    return [kernel for _, kernel in named_dynamic_embedding_kernels(model)]

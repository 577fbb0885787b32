"""Sharding options of dynamic and TorchRec tables for TorchRec's planner."""

import copy
import dataclasses
import types

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    ShardEstimator,
    ShardingOption,
    Topology,
)
from torchrec.distributed.planner.utils import sharder_name

from ..dynamicemb_config import DynamicEmbTableOptions
from .constraints import DynamicEmbParameterConstraints
from .parameter_sharding import DYNAMICEMB_COMPUTE_KERNEL, DYNAMICEMB_SHARDING_TYPE
from .prepare import _requested_options, dynamic_shard_storage, prepare_table_options

__all__ = ["DynamicEmbeddingEnumerator", "is_dynamic_table"]

# What TorchRec's estimators are asked about in place of a dynamic table: a
# kernel they know, with the same sharding, inputs and outputs.
_PROXY_COMPUTE_KERNEL = EmbeddingComputeKernel.FUSED.value


def is_dynamic_table(constraints: ParameterConstraints | None) -> bool:
    """True when ``constraints`` mark their table as a dynamic embedding table."""
    return isinstance(constraints, DynamicEmbParameterConstraints) and bool(
        constraints.use_dynamicemb
    )


class DynamicEmbeddingEnumerator(EmbeddingEnumerator):
    """TorchRec's ``EmbeddingEnumerator`` that also enumerates dynamic tables.

    Used exactly as ``EmbeddingEnumerator``. A table whose constraints are
    ``DynamicEmbParameterConstraints(use_dynamicemb=True)`` gets one sharding
    option: ``ROW_WISE`` with compute kernel ``CUSTOMIZED_KERNEL`` (the
    sharders' mark of a dynamic table, see ``parameter_sharding``). Every
    other table is enumerated as TorchRec does, except that
    ``CUSTOMIZED_KERNEL`` is never offered to it.

    Estimates of a dynamic table's shards:

    * perf: TorchRec's estimators rate the same sharding with the ``FUSED``
      kernel (the same lookups and communication).
    * storage: the input/output buffers TorchRec's estimators count for the
      same sharding, and nothing for the table itself. The topology's memory
      budgets TorchRec's tables and these buffers; a dynamic table takes its
      budget from its own options (``global_hbm_for_values``), so a topology
      smaller than the dynamic tables plans, and the static tables are fitted
      into it as TorchRec fits them. What one rank of the table allocates
      (``dynamic_shard_storage``) is still worked out, so options a table
      cannot be built from (an optimizer without a dynamicemb row layout, a
      cache budget below 16 rows) are refused here, naming the table.

    The options used are the table's ``dynamicemb_options`` prepared for the
    topology's world size (``prepare_table_options``), whether or not
    the planner prepared them already.

    Args:
        topology (Topology): the devices and their memory.
        batch_size (Optional[int]): batch size per rank. Defaults to
            TorchRec's ``BATCH_SIZE``.
        constraints (Optional[Dict[str, ParameterConstraints]]): per-table
            constraints; ``DynamicEmbParameterConstraints`` mark dynamic
            tables.
        estimator (Optional[Union[ShardEstimator, List[ShardEstimator]]]):
            shard estimators, as for ``EmbeddingEnumerator``.
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int | None = BATCH_SIZE,
        constraints: dict[str, ParameterConstraints] | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
    ) -> None:
        super().__init__(
            topology=topology,
            batch_size=batch_size if batch_size else BATCH_SIZE,
            constraints=constraints,
            estimator=estimator,
        )
        self._dynamicemb_topology = topology

    # ------------------------------------------------------------ filters --

    def _is_dynamic(self, name: str) -> bool:
        return bool(self._constraints) and is_dynamic_table(self._constraints.get(name))

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], *args, **kwargs
    ) -> list[str]:
        if not self._is_dynamic(name):
            return super()._filter_sharding_types(name, allowed_sharding_types, *args, **kwargs)
        return self._only_choice(
            name,
            "sharding type",
            DYNAMICEMB_SHARDING_TYPE,
            self._constraints[name].sharding_types,
            allowed_sharding_types,
        )

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str, *args, **kwargs
    ) -> list[str]:
        if not self._is_dynamic(name):
            allowed = [k for k in allowed_compute_kernels if k != DYNAMICEMB_COMPUTE_KERNEL]
            return super()._filter_compute_kernels(name, allowed, sharding_type, *args, **kwargs)
        return self._only_choice(
            name,
            "compute kernel",
            DYNAMICEMB_COMPUTE_KERNEL,
            self._constraints[name].compute_kernels,
            allowed_compute_kernels,
            f" for {sharding_type!r} sharding",
        )

    @staticmethod
    def _only_choice(
        name: str,
        what: str,
        choice: str,
        requested: list[str] | None,
        offered: list[str],
        where: str = "",
    ) -> list[str]:
        """[choice], the one ``what`` of a dynamic table; a ValueError naming
        the table when its constraints or its sharder leave it out."""
        if requested and choice not in requested:
            raise ValueError(
                f"table {name!r} is a dynamic embedding table, whose {what} is {choice!r} "
                f"only; its constraints allow only {requested!r}"
            )
        if choice not in offered:
            raise ValueError(
                f"table {name!r} is a dynamic embedding table, but its sharder does not "
                f"offer {what} {choice!r}{where} (it offers {offered!r}); use the sharders "
                "of dynamicemb.shard"
            )
        return [choice]

    # ---------------------------------------------------------- estimates --

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        """Estimates perf and storage of every sharding option.

        TorchRec's options go to the estimators unchanged. A dynamic option
        is represented by three ``FUSED`` stand-ins: one with its real shards
        (perf), and two whose non-empty shards have one and two rows: the
        estimators' storage is affine in the rows, so twice the first minus
        the second is the storage that does not depend on the rows (the
        input/output buffers), which is the option's storage. The table's
        own storage is not part of the topology's budget (see the class).
        """
        dynamic = [
            so
            for so in sharding_options
            if so.compute_kernel == DYNAMICEMB_COMPUTE_KERNEL and self._is_dynamic(so.name)
        ]
        dynamic_ids = {id(so) for so in dynamic}
        others = [so for so in sharding_options if id(so) not in dynamic_ids]
        stand_ins = [
            (so, _stand_in(so, None), _stand_in(so, 1), _stand_in(so, 2)) for so in dynamic
        ]
        super().populate_estimates(
            others + [p for _, full, one, two in stand_ins for p in (full, one, two)]
        )
        for so, full, one, two in stand_ins:
            self._shard_storage(so)  # refuses options the table cannot be built from
            for shard, perf_shard, s1, s2 in zip(so.shards, full.shards, one.shards, two.shards):
                shard.perf = perf_shard.perf
                shard.storage = _affine_intercept(s1.storage, s2.storage)

    def prepared_options(self, sharding_option: ShardingOption) -> DynamicEmbTableOptions:
        """The per-rank options of a dynamic table's sharding option.

        Args:
            sharding_option (ShardingOption): an option of a dynamic table.

        Returns:
            DynamicEmbTableOptions: its ``dynamicemb_options`` prepared for
            this topology's world size (a new object).
        """
        options = _requested_options(self._constraints[sharding_option.name].dynamicemb_options)
        rows, dim = sharding_option.tensor.shape
        shape_config = types.SimpleNamespace(
            name=sharding_option.name, num_embeddings=int(rows), embedding_dim=int(dim)
        )
        return prepare_table_options(options, shape_config, self._dynamicemb_topology.world_size)

    def _shard_storage(self, sharding_option: ShardingOption):
        options = self.prepared_options(sharding_option)
        sharder = self._sharder_map.get(sharder_name(type(sharding_option.module[1])))
        fused_params = getattr(sharder, "fused_params", None) or {}
        try:
            return dynamic_shard_storage(
                options,
                sharding_option.tensor.dtype,
                fused_params.get("optimizer"),
                self._dynamicemb_topology.compute_device,
            )
        except ValueError as error:
            raise ValueError(f"table {sharding_option.name!r}: {error}") from None


def _stand_in(sharding_option: ShardingOption, rows: int | None) -> ShardingOption:
    """A FUSED copy of a dynamic option, its non-empty shards given ``rows``
    rows (None: shards as they are), without estimates."""
    stand_in = copy.copy(sharding_option)
    stand_in.compute_kernel = _PROXY_COMPUTE_KERNEL
    shards = []
    for shard in sharding_option.shards:
        size = list(shard.size)
        offset = list(shard.offset)
        if rows is not None and size[0] > 0:
            size[0] = rows
        shards.append(dataclasses.replace(shard, size=size, offset=offset, storage=None, perf=None))
    stand_in.shards = shards
    return stand_in


def _affine_intercept(one, two):
    """``2 * one - two`` per storage tier (never below 0)."""
    return dataclasses.replace(
        one,
        **{
            f.name: max(0, 2 * getattr(one, f.name) - getattr(two, f.name))
            for f in dataclasses.fields(one)
        },
    )

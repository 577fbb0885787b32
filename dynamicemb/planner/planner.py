"""DynamicEmbeddingShardingPlanner: TorchRec's planner for models with dynamic tables."""

import copy
import dataclasses
from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    Proposer,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder, ParameterSharding, ShardingPlan
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from ..dynamicemb_config import DynamicEmbTableOptions
from .constraints import DynamicEmbParameterConstraints
from .enumerator import DynamicEmbeddingEnumerator, is_dynamic_table
from .parameter_sharding import (
    DYNAMICEMB_COMPUTE_KERNEL,
    DYNAMICEMB_SHARDING_TYPE,
    DynamicEmbParameterSharding,
)
from .prepare import (
    _prepare_dynemb_table_options,
    _record_request,
    _requested_options,
    prepare_table_options,
)
from .topology import topology as make_topology

__all__ = ["DynamicEmbeddingShardingPlanner", "_prepare_dynemb_table_options"]

# The share of each device's memory the default storage reservation keeps
# from TorchRec's tables (TorchRec's own default reserves this share too).
DEFAULT_RESERVED_PERCENTAGE = 0.15


class DynamicEmbeddingShardingPlanner:
    """TorchRec's ``EmbeddingShardingPlanner`` for models with dynamic tables.

    Takes TorchRec's planner arguments plus ``eb_configs``, the global
    ``EmbeddingConfig`` / ``EmbeddingBagConfig`` of every table, from which
    each dynamic table's per-rank options are derived.

    On construction it

    1. validates: every table is named exactly once in ``eb_configs``, and
       (when ``constraints`` are given) their keys are exactly the table
       names, each a ``ParameterConstraints``; a dynamic table allows
       ``ROW_WISE`` sharding and the ``CUSTOMIZED_KERNEL`` compute kernel;
    2. prepares the options of every table whose constraints are
       ``DynamicEmbParameterConstraints(use_dynamicemb=True)`` with
       ``prepare_table_options`` for the topology's world size
       (``dim``, completed initializer bounds, ``bucket_capacity``,
       ``max_capacity``, ``init_capacity``, ``local_hbm_for_values``);
    3. builds TorchRec's planner with a ``DynamicEmbeddingEnumerator`` (unless
       one is given).

    Step 2 updates each dynamic table's ``dynamicemb_options`` in place: the
    object the user passed holds the prepared values afterwards
    (``max_capacity``, ``bucket_capacity``, ...). One object given for
    several tables is updated for the first of them (in ``constraints``
    order); the others' constraints get a prepared object of their own.
    Constraints a planner has updated may be given to another planner (of
    another world size): it prepares them from the options as the user gave
    them, unless fields were edited since. Nothing is changed when
    validation fails.

    ``plan`` and ``collective_plan`` return TorchRec's ``ShardingPlan`` in
    which the entry of every dynamic table is a
    ``DynamicEmbParameterSharding`` carrying the prepared options (including
    ``dist_type``); the other entries are TorchRec's.

    Args:
        eb_configs (List[BaseEmbeddingConfig]): every table of the model.
        topology (Optional[Topology]): the devices. Default: the default
            process group's world size if it is initialized, else 1, on
            ``"cuda"`` if available, else ``"cpu"``. Its memory is the
            budget of TorchRec's tables (and of the lookups' input/output
            buffers, dynamic tables' included); it does not include what the
            dynamic tables allocate, which their own options budget
            (``global_hbm_for_values``).
        batch_size (Optional[int]): batch size per rank (TorchRec's default
            when None).
        enumerator (Optional[Enumerator]): a ``DynamicEmbeddingEnumerator``
            when the model has dynamic tables. Default: one built from the
            topology, batch size and constraints.
        storage_reservation (Optional[StorageReservation]): as in TorchRec.
            Default: ``FixedPercentageStorageReservation(0.15)``, the policy
            TorchRec recommends over its own default (whose heuristic warns
            that it over-estimates dense tensors on the meta device).
        proposer (Optional[Union[Proposer, List[Proposer]]]): as in TorchRec.
        partitioner (Optional[Partitioner]): as in TorchRec.
        performance_model (Optional[PerfModel]): as in TorchRec.
        stats (Optional[Union[Stats, List[Stats]]]): as in TorchRec.
        constraints (Optional[Dict[str, ParameterConstraints]]): per-table
            constraints keyed by table name, one for every table of
            ``eb_configs``; ``DynamicEmbParameterConstraints`` mark dynamic
            tables. None: no constraints (no dynamic tables).
        debug (bool): TorchRec's planner debug output. Defaults to True.

    Raises:
        TypeError: an ``eb_configs`` entry is not a ``BaseEmbeddingConfig``, a
            constraint is not a ``ParameterConstraints``, or ``enumerator`` is
            not a ``DynamicEmbeddingEnumerator`` while there are dynamic
            tables.
        ValueError: a table is named twice in ``eb_configs``; constraints lack
            tables or name tables not in ``eb_configs``; a dynamic table's
            constraints exclude row-wise sharding or the customized kernel;
            its options cannot be prepared (bad ``bucket_capacity``, ...).
            The message names the table(s).

    Example::

        from dynamicemb.planner import DynamicEmbeddingShardingPlanner, topology

        # configs: the model's EmbeddingBagConfigs; constraints: one per table,
        # DynamicEmbParameterConstraints(use_dynamicemb=True, ...) for the dynamic ones.
        planner = DynamicEmbeddingShardingPlanner(
            eb_configs=configs,
            topology=topology(world_size=dist.get_world_size(), compute_device="cuda",
                              local_world_size=8),
            constraints=constraints,
            batch_size=4096,
        )
        plan = planner.collective_plan(ebc, [sharder], dist.group.WORLD)  # every rank
    """

    def __init__(
        self,
        eb_configs: list[BaseEmbeddingConfig],
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Enumerator | None = None,
        storage_reservation: StorageReservation | None = None,
        proposer: Proposer | list[Proposer] | None = None,
        partitioner: Partitioner | None = None,
        performance_model: PerfModel | None = None,
        stats: Stats | list[Stats] | None = None,
        constraints: dict[str, DynamicEmbParameterConstraints] | None = None,
        debug: bool = True,
    ) -> None:
        self._eb_configs = _index_configs(eb_configs)
        _check_constraints(self._eb_configs, constraints)
        if topology is None:
            topology = _default_topology()
        self._topology = topology
        self._world_size = topology.world_size

        # Prepare every dynamic table before updating any (all or nothing).
        prepared: dict[str, DynamicEmbTableOptions] = {}
        requests: dict[str, DynamicEmbTableOptions] = {}
        for name, constraint in (constraints or {}).items():
            if not is_dynamic_table(constraint):
                continue
            try:
                # A copy: the user's object is updated below.
                requests[name] = copy.copy(_requested_options(constraint.dynamicemb_options))
                prepared[name] = prepare_table_options(
                    requests[name], self._eb_configs[name], self._world_size
                )
            except (TypeError, ValueError) as error:
                raise type(error)(f"table {name!r}: {error}") from None
        if (
            prepared
            and enumerator is not None
            and not isinstance(enumerator, DynamicEmbeddingEnumerator)
        ):
            raise TypeError(
                "a model with dynamic tables needs a DynamicEmbeddingEnumerator, got "
                f"{type(enumerator).__name__}"
            )
        updated: set[int] = set()
        for name, options in prepared.items():
            constraint = constraints[name]
            given = constraint.dynamicemb_options
            if given is not None and id(given) not in updated:
                # The user's object is updated (the spec's step: "it updates
                # that table's DynamicEmbTableOptions").
                updated.add(id(given))
                for f in dataclasses.fields(DynamicEmbTableOptions):
                    setattr(given, f.name, getattr(options, f.name))
                prepared[name] = options = given
            else:
                # A table whose object an earlier table's preparation updated
                # gets one of its own.
                constraint.dynamicemb_options = options
            _record_request(options, requests[name])
        self._constraints = constraints
        self._dynamic_options = prepared

        if enumerator is None:
            enumerator = DynamicEmbeddingEnumerator(
                topology=topology,
                batch_size=batch_size,
                constraints=constraints,
            )
        if storage_reservation is None:
            storage_reservation = FixedPercentageStorageReservation(DEFAULT_RESERVED_PERCENTAGE)
        self._planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=batch_size,
            enumerator=enumerator,
            storage_reservation=storage_reservation,
            proposer=proposer,
            partitioner=partitioner,
            performance_model=performance_model,
            stats=stats,
            constraints=constraints,
            debug=debug,
        )

    @property
    def topology(self) -> Topology:
        """The topology the plan is made for."""
        return self._topology

    @property
    def constraints(self) -> dict[str, ParameterConstraints] | None:
        """The constraints, dynamic tables' options prepared."""
        return self._constraints

    @property
    def dynamicemb_options(self) -> dict[str, DynamicEmbTableOptions]:
        """Prepared per-rank options of every dynamic table, by table name."""
        return dict(self._dynamic_options)

    def plan(
        self,
        module: nn.Module,
        sharders: list[ModuleSharder[nn.Module]],
    ) -> ShardingPlan:
        """Plans the sharding of ``module`` on this process.

        Args:
            module (nn.Module): the model (its embedding modules may be on the
                meta device).
            sharders (List[ModuleSharder[nn.Module]]): the sharders; those of
                modules with dynamic tables must offer row-wise sharding with
                ``CUSTOMIZED_KERNEL`` (``dynamicemb.shard``'s do).

        Returns:
            ShardingPlan: TorchRec's plan, dynamic tables' entries being
            ``DynamicEmbParameterSharding``.
        """
        return self._mark_dynamic_tables(self._planner.plan(module, sharders))

    def collective_plan(
        self,
        module: nn.Module,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plans on rank 0 of ``pg`` and gives every rank the same plan.

        Each rank marks the dynamic tables' entries with its own prepared
        options (identical on every rank), so the options are never sent.

        Args:
            module (nn.Module): the model.
            sharders (Optional[List[ModuleSharder[nn.Module]]]): as for
                ``plan``; None means TorchRec's default sharders.
            pg (Optional[dist.ProcessGroup]): the process group; None means the
                default one.

        Returns:
            ShardingPlan: as ``plan``.
        """
        return self._mark_dynamic_tables(self._planner.collective_plan(module, sharders, pg))

    def _mark_dynamic_tables(self, plan: ShardingPlan) -> ShardingPlan:
        init_fields = [f.name for f in dataclasses.fields(ParameterSharding) if f.init]
        for module_path, module_plan in plan.plan.items():
            for name in list(module_plan.keys()):
                options = self._dynamic_options.get(name)
                if options is None:
                    continue
                sharding = module_plan[name]
                if (
                    sharding.sharding_type != DYNAMICEMB_SHARDING_TYPE
                    or sharding.compute_kernel != DYNAMICEMB_COMPUTE_KERNEL
                ):
                    raise RuntimeError(
                        f"dynamic table {name!r} of {module_path!r} was planned "
                        f"{sharding.sharding_type!r} with kernel {sharding.compute_kernel!r}, "
                        f"not {DYNAMICEMB_SHARDING_TYPE!r} with {DYNAMICEMB_COMPUTE_KERNEL!r}"
                    )
                _check_shape(name, module_path, sharding, self._eb_configs[name])
                module_plan[name] = DynamicEmbParameterSharding(
                    **{field: getattr(sharding, field) for field in init_fields},
                    dynamicemb_options=options,
                )
        return plan


def _index_configs(eb_configs: Sequence[BaseEmbeddingConfig]) -> dict[str, BaseEmbeddingConfig]:
    if isinstance(eb_configs, (str, bytes)) or not isinstance(eb_configs, Sequence):
        raise TypeError(
            f"eb_configs must be a list of TorchRec embedding configs, got {eb_configs!r}"
        )
    for index, config in enumerate(eb_configs):
        if not isinstance(config, BaseEmbeddingConfig):
            raise TypeError(
                f"eb_configs[{index}] must be a TorchRec BaseEmbeddingConfig "
                f"(EmbeddingConfig, EmbeddingBagConfig), got {config!r}"
            )
    counts = Counter(config.name for config in eb_configs)
    duplicated = sorted(name for name, count in counts.items() if count > 1)
    if duplicated:
        raise ValueError(
            f"eb_configs must name every table exactly once; named more than once: {duplicated}"
        )
    return {config.name: config for config in eb_configs}


def _check_constraints(
    configs: dict[str, BaseEmbeddingConfig],
    constraints: dict[str, ParameterConstraints] | None,
) -> None:
    if constraints is None:
        return
    if not isinstance(constraints, dict):
        raise TypeError(
            f"constraints must be a dict of table name to ParameterConstraints, got {constraints!r}"
        )
    missing = [name for name in configs if name not in constraints]
    if missing:
        raise ValueError(
            f"constraints must have an entry for every table of eb_configs; missing: {missing}"
        )
    extra = [name for name in constraints if name not in configs]
    if extra:
        raise ValueError(f"constraints name tables that are not in eb_configs: {extra}")
    for name, constraint in constraints.items():
        if not isinstance(constraint, ParameterConstraints):
            raise TypeError(
                f"constraints[{name!r}] must be a ParameterConstraints, got {constraint!r}"
            )
        if not is_dynamic_table(constraint):
            continue
        if constraint.sharding_types and DYNAMICEMB_SHARDING_TYPE not in constraint.sharding_types:
            raise ValueError(
                f"table {name!r} is a dynamic embedding table, sharded "
                f"{DYNAMICEMB_SHARDING_TYPE!r} only, but its constraints allow only "
                f"sharding_types={constraint.sharding_types!r}"
            )
        if (
            constraint.compute_kernels
            and DYNAMICEMB_COMPUTE_KERNEL not in constraint.compute_kernels
        ):
            raise ValueError(
                f"table {name!r} is a dynamic embedding table, whose compute kernel is "
                f"{DYNAMICEMB_COMPUTE_KERNEL!r}, but its constraints allow only "
                f"compute_kernels={constraint.compute_kernels!r}"
            )


def _check_shape(
    name: str, module_path: str, sharding: ParameterSharding, config: BaseEmbeddingConfig
) -> None:
    spec = sharding.sharding_spec
    shards = getattr(spec, "shards", None)
    if not shards:
        return
    rows = sum(shard.shard_sizes[0] for shard in shards)
    cols = max(shard.shard_sizes[1] for shard in shards)
    if (rows, cols) != (config.num_embeddings, config.embedding_dim):
        raise ValueError(
            f"dynamic table {name!r} of {module_path!r} has {rows} x {cols} rows x dims in the "
            f"model but eb_configs says {config.num_embeddings} x {config.embedding_dim}"
        )


def _default_topology() -> Topology:
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        try:
            from torchrec.distributed.comm import get_local_size

            local_world_size = get_local_size(world_size)
        except ImportError:
            local_world_size = world_size
    else:
        world_size = local_world_size = 1
    return make_topology(
        world_size=world_size,
        compute_device="cuda" if torch.cuda.is_available() else "cpu",
        local_world_size=local_world_size,
    )

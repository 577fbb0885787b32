"""Sharded EmbeddingCollection / EmbeddingBagCollection with dynamic tables,
and their sharders.

A table is dynamic when its plan entry is a ``DynamicEmbParameterSharding``
(``dynamicemb.planner.parameter_sharding``). The sharded modules are
TorchRec's, with the dynamic tables taken out of TorchRec's row-wise group into
a sharding of their own (``DYNAMICEMB_SHARDING_KEY``); every other table of the
collection keeps TorchRec's sharding, kernel and state dict.
"""

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torchrec.distributed.embedding import (
    EmbeddingCollectionSharder,
    ShardedEmbeddingCollection,
)
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .._seams import provided
from ..embedding.module_warnings import warn_state_dict_without_rows
from ..planner.parameter_sharding import initializer_table_ids, is_dynamicemb_sharding
from .batch_checks import COUNTERS, POOLING, BatchCheck
from .input_dist import dedup_kjt
from .sharding import (
    DynamicEmbRwPooledEmbeddingSharding,
    DynamicEmbRwSequenceEmbeddingSharding,
)

__all__ = [
    "DYNAMICEMB_SHARDING_KEY",
    "DynamicEmbeddingBagCollectionSharder",
    "DynamicEmbeddingCollectionSharder",
    "ShardedDynamicEmbeddingBagCollection",
    "ShardedDynamicEmbeddingCollection",
]

# Key of the dynamic tables' sharding among a sharded module's shardings
# (TorchRec keys its shardings by sharding type; the dynamic tables are
# row-wise too, but need their own input dist and lookup).
DYNAMICEMB_SHARDING_KEY = "row_wise_dynamicemb"


def _separate_dynamic_tables(
    sharding_type_to_infos: dict[str, list[EmbeddingShardingInfo]],
    table_ids: dict[str, int],
) -> dict[str, list[EmbeddingShardingInfo]]:
    """Moves the dynamic tables' infos under ``DYNAMICEMB_SHARDING_KEY``,
    ordered by initializer table id: a dynamic sharding's table at position
    ``i`` has initializer id ``i`` (``initializer_table_ids``)."""
    result: dict[str, list[EmbeddingShardingInfo]] = {}
    dynamic: list[EmbeddingShardingInfo] = []
    for sharding_type, infos in sharding_type_to_infos.items():
        kept = []
        for info in infos:
            (dynamic if is_dynamicemb_sharding(info.param_sharding) else kept).append(info)
        if kept:
            result[sharding_type] = kept
    names = sorted(info.embedding_config.name for info in dynamic)
    if names != sorted(table_ids):
        raise ValueError(
            f"dynamic tables {names} of the sharding infos differ from the collection's "
            f"dynamic tables {sorted(table_ids)}"
        )
    if dynamic:
        result[DYNAMICEMB_SHARDING_KEY] = sorted(
            dynamic, key=lambda info: table_ids[info.embedding_config.name]
        )
    return result


def _collection_table_ids(configs: list[Any], plan: dict[str, ParameterSharding]) -> dict[str, int]:
    """Initializer ids of a collection's dynamic tables (config order)."""
    names = [config.name for config in configs]
    return initializer_table_ids(
        names, {n for n in names if n in plan and is_dynamicemb_sharding(plan[n])}
    )


def _dynamic_table_names(plan: dict[str, ParameterSharding]) -> list[str]:
    return [name for name, ps in plan.items() if is_dynamicemb_sharding(ps)]


# The entry of the fused_params a dynamic sharder hands its sharded module
# that carries the sharder's static_fused_params (taken out before TorchRec
# sees them).
STATIC_FUSED_PARAMS = "dynamicemb_static_fused_params"


def _refuse_shared_fused_params(
    plan: dict[str, ParameterSharding], dynamic: set[str], fused: dict[str, Any]
) -> None:
    """A TorchRec table with a fused optimizer in a collection whose sharder
    was given no static_fused_params takes the sharder's fused_params, as
    TorchRec's own sharder gives them to every table; refused when their
    optimizer is one TorchRec's kernels do not have (a DynamicEmbOptimType)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    optimizer = fused.get("optimizer")
    if optimizer is None or isinstance(optimizer, EmbOptimType):
        return
    tables = [
        name
        for name, ps in plan.items()
        if name not in dynamic and ps.compute_kernel != EmbeddingComputeKernel.DENSE.value
    ]
    if tables:
        raise ValueError(
            f"tables {sorted(tables)} are TorchRec's (compute kernels with a fused optimizer) "
            f"in a collection sharded by a dynamicemb sharder whose fused_params name "
            f"{optimizer}, which TorchRec's kernels do not have: give TorchRec's tables theirs "
            "in static_fused_params (for example static_fused_params={'optimizer': "
            "EmbOptimType.EXACT_SGD, 'learning_rate': 0.1})"
        )


def _drop_dynamic_weights(
    state_dict: dict[str, Any], prefix: str, collection: str, names: list[str]
) -> None:
    """Removes dense weights of dynamic tables from a state dict being loaded:
    their rows live in hash tables (checkpointed by DynamicEmbDump / Load)."""
    for name in names:
        state_dict.pop(f"{prefix}{collection}.{name}.weight", None)


class _DynamicTablesMixin:
    """What both sharded collections add to TorchRec's: the dynamic tables'
    own sharding (``DYNAMICEMB_SHARDING_KEY``), and no dense weights for them.

    Each class names its TorchRec parent (``_TORCHREC_CLASS``), the
    sharding of its dynamic tables (``_DYNAMIC_SHARDING``), the
    unsharded module's method listing its table configs
    (``_MODULE_CONFIGS``), its own attribute holding them
    (``_CONFIGS_ATTR``) and its key in the state dict
    (``STATE_DICT_COLLECTION``).
    """

    _TORCHREC_CLASS: type[Any]
    _DYNAMIC_SHARDING: type[Any]
    _FUSED_PARAMS_ARG: int
    _MODULE_CONFIGS: str
    _CONFIGS_ATTR: str
    STATE_DICT_COLLECTION: str

    @classmethod
    def create_grouped_sharding_infos(
        cls,
        module: Any,
        table_name_to_parameter_sharding: dict[str, ParameterSharding],
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, list[EmbeddingShardingInfo]]:
        # The sharder's fused_params configure the dynamic tables; TorchRec's
        # tables get its static_fused_params (carried under STATIC_FUSED_PARAMS).
        args = list(args)
        at = cls._FUSED_PARAMS_ARG
        fused = dict((args[at] if len(args) > at else kwargs.get("fused_params")) or {})
        static = fused.pop(STATIC_FUSED_PARAMS, None)

        def infos_with(params):
            if len(args) > at:
                args[at] = params
            else:
                kwargs["fused_params"] = params
            return super(_DynamicTablesMixin, cls).create_grouped_sharding_infos(
                module, table_name_to_parameter_sharding, *args, **kwargs
            )

        infos = infos_with(fused)
        dynamic = set(_dynamic_table_names(table_name_to_parameter_sharding))
        if static is not None:
            theirs = {
                info.embedding_config.name: info
                for group in infos_with(dict(static)).values()
                for info in group
            }
            infos = {
                st: [
                    i if i.embedding_config.name in dynamic else theirs[i.embedding_config.name]
                    for i in group
                ]
                for st, group in infos.items()
            }
        elif fused:
            _refuse_shared_fused_params(table_name_to_parameter_sharding, dynamic, fused)
        return _separate_dynamic_tables(
            infos,
            _collection_table_ids(
                getattr(module, cls._MODULE_CONFIGS)(), table_name_to_parameter_sharding
            ),
        )

    @classmethod
    def _create_sharding(
        cls,
        dynamic: bool,
        parent: Callable[..., Any],
        sharding_infos: list[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: torch.device | None,
        qcomm_codecs_registry: dict[str, Any] | None,
        **theirs: Any,
    ) -> Any:
        """The sharding of one group of tables (TorchRec's
        ``create_embedding_sharding`` / ``create_embedding_bag_sharding``):
        ``_DYNAMIC_SHARDING`` for the ``dynamic`` group, else ``parent``'s
        (the TorchRec method overridden, given ``theirs``, the arguments
        only it reads)."""
        if dynamic:
            return cls._DYNAMIC_SHARDING(
                sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry
            )
        return parent(
            sharding_infos=sharding_infos,
            env=env,
            device=device,
            qcomm_codecs_registry=qcomm_codecs_registry,
            **theirs,
        )

    def input_dist(self, ctx: Any, features: Any) -> Any:
        # Every rank's batch is checked before any collective of the step,
        # with one verdict for all ranks (dynamicemb.shard.batch_checks); a
        # collection without dynamic tables is TorchRec's as it is.
        if isinstance(features, KeyedJaggedTensor) and not torch.compiler.is_compiling():
            check = self._dynamicemb_batch_check()
            if check is not None:
                check(features)
        return super().input_dist(ctx, features)

    def _dynamicemb_batch_check(self) -> BatchCheck | None:
        if "_dynamicemb_check" not in self.__dict__:
            # An EC keeps its shardings by type, an EBC in a list.
            by_type = self.__dict__.get("_sharding_type_to_sharding")
            shardings = self._embedding_shardings if by_type is None else by_type.values()
            dynamic = (DynamicEmbRwPooledEmbeddingSharding, DynamicEmbRwSequenceEmbeddingSharding)
            shardings = list(shardings)
            features = [
                name for s in shardings if isinstance(s, dynamic) for name in s.feature_names()
            ]
            every = [name for s in shardings for name in s.feature_names()]
            # What the dynamic tables' kernels read the KJT weights as
            # (DynamicEmbeddingKernel.forward).
            if by_type is not None:
                weights = COUNTERS
            else:
                weights = POOLING if self._is_weighted else None
            # The static tables' rows bound their features' ids.
            dynamic_tables = set(_dynamic_table_names(self.module_sharding_plan))
            static_rows = {
                feature: config.num_embeddings
                for config in getattr(self, self._CONFIGS_ATTR)
                if config.name not in dynamic_tables
                for feature in config.feature_names
            }
            check = None
            if features:
                check = BatchCheck(
                    features,
                    self._device,
                    self._env.process_group,
                    every,
                    weights,
                    static_rows=static_rows,
                    pooled=by_type is None,
                )
                _RAW_ID_RANGES.features.update(features)
            self.__dict__["_dynamicemb_check"] = check
        return self.__dict__["_dynamicemb_check"]

    def reset_parameters(self) -> None:
        # Dynamic tables have no dense weight to initialize.
        configs = getattr(self, self._CONFIGS_ATTR)
        dynamic = set(_dynamic_table_names(self.module_sharding_plan))
        setattr(self, self._CONFIGS_ATTR, [c for c in configs if c.name not in dynamic])
        try:
            super().reset_parameters()
        finally:
            setattr(self, self._CONFIGS_ATTR, configs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        # TorchRec's entries of the static tables, then one entry per dynamic
        # table with its rows, written by dynamicemb.checkpoint
        # (dynamicemb/checkpoint/model_state.py; collective).
        out = super().state_dict(*args, **kwargs)
        if _dynamic_table_names(self.module_sharding_plan):
            rows = provided("model_state_rows")
            if rows is None:
                warn_state_dict_without_rows()
            else:
                rows.save(self, out, kwargs.get("prefix", args[1] if len(args) > 1 else ""))
        return out

    @staticmethod
    def _pre_load_state_dict_hook(
        self: Any,
        state_dict: dict[str, Any],
        prefix: str,
        *args: Any,
    ) -> None:
        if _dynamic_table_names(self.module_sharding_plan):
            rows = provided("model_state_rows")
            if rows is not None:
                rows.load(self, state_dict, prefix)
        _drop_dynamic_weights(
            state_dict,
            prefix,
            self.STATE_DICT_COLLECTION,
            _dynamic_table_names(self.module_sharding_plan),
        )
        self._TORCHREC_CLASS._pre_load_state_dict_hook(self, state_dict, prefix, *args)


class ShardedDynamicEmbeddingCollection(_DynamicTablesMixin, ShardedEmbeddingCollection):
    """TorchRec's ``ShardedEmbeddingCollection`` with dynamic tables.

    Dynamic tables are looked up by ``DynamicEmbeddingKernel`` modules behind their
    own row-wise input dist; with ``use_index_dedup`` every sharding's keys
    are deduplicated per feature before the all-to-all (for dynamic tables the
    occurrence counts travel as frequency counters, so LFU scores count the
    same as without dedup). Constructor arguments are the parent's.
    """

    _TORCHREC_CLASS = ShardedEmbeddingCollection
    _DYNAMIC_SHARDING = DynamicEmbRwSequenceEmbeddingSharding
    _FUSED_PARAMS_ARG = 0  # of create_grouped_sharding_infos' positional arguments
    _MODULE_CONFIGS = "embedding_configs"
    _CONFIGS_ATTR = "_embedding_configs"
    STATE_DICT_COLLECTION = "embeddings"

    @classmethod
    def create_embedding_sharding(
        cls,
        sharding_type: str,
        sharding_infos: list[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: torch.device | None = None,
        qcomm_codecs_registry: dict[str, Any] | None = None,
    ):
        return cls._create_sharding(
            sharding_type == DYNAMICEMB_SHARDING_KEY,
            super().create_embedding_sharding,
            sharding_infos,
            env,
            device,
            qcomm_codecs_registry,
            sharding_type=sharding_type,
        )

    def _create_hash_size_info(self, *args: Any, **kwargs: Any) -> None:
        # dedup_kjt needs no per-feature hash sizes (dynamic keys are not
        # bounded by num_embeddings).
        return None

    def _dedup_indices(
        self,
        ctx: Any,
        input_feature_splits: list[KeyedJaggedTensor],
    ) -> list[KeyedJaggedTensor]:
        sharding_types = list(self._sharding_type_to_sharding.keys())
        deduped: list[KeyedJaggedTensor] = []
        for sharding_type, features in zip(sharding_types, input_feature_splits):
            dynamic = sharding_type == DYNAMICEMB_SHARDING_KEY
            if dynamic and self._env.world_size == 1 and sharding_type == sharding_types[-1]:
                # Nothing to save on an all-to-all with oneself, and the
                # module looks each distinct key up once anyway: the keys go
                # as they are, and no reverse index expands the rows after.
                # (TorchRec reads the reverse indices by sharding position:
                # leaving out the last sharding's shifts no other's; the
                # dynamic sharding is the last, _separate_dynamic_tables.)
                deduped.append(features)
                continue
            dedup_features, reverse = dedup_kjt(features, counts_as_weights=dynamic)
            ctx.input_features.append(features)
            ctx.reverse_indices.append(reverse)
            deduped.append(dedup_features)
        return deduped


class ShardedDynamicEmbeddingBagCollection(_DynamicTablesMixin, ShardedEmbeddingBagCollection):
    """TorchRec's ``ShardedEmbeddingBagCollection`` with dynamic tables.

    Dynamic tables pool with SUM on each rank (weighted SUM with the KJT
    weights when the collection is weighted); MEAN bags are divided by their
    lengths after the reduce-scatter, as TorchRec does for its row-wise tables.
    Constructor arguments are the parent's.
    """

    _TORCHREC_CLASS = ShardedEmbeddingBagCollection
    _DYNAMIC_SHARDING = DynamicEmbRwPooledEmbeddingSharding
    _MODULE_CONFIGS = "embedding_bag_configs"
    _CONFIGS_ATTR = "_embedding_bag_configs"
    STATE_DICT_COLLECTION = "embedding_bags"
    _FUSED_PARAMS_ARG = 1  # after the prefix

    @classmethod
    def create_embedding_bag_sharding(
        cls,
        sharding_infos: list[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: torch.device | None = None,
        permute_embeddings: bool = False,
        qcomm_codecs_registry: dict[str, Any] | None = None,
    ):
        # The dynamic tables come as one group of their own
        # (_separate_dynamic_tables): its first table says which group it is.
        return cls._create_sharding(
            bool(sharding_infos) and is_dynamicemb_sharding(sharding_infos[0].param_sharding),
            super().create_embedding_bag_sharding,
            sharding_infos,
            env,
            device,
            qcomm_codecs_registry,
            permute_embeddings=permute_embeddings,
        )


def _with_row_wise(sharding_types: list[str]) -> list[str]:
    # Dynamic tables are row-wise on every device (TorchRec offers row-wise
    # EmbeddingBagCollection sharding on CUDA only).
    sharding_types = list(sharding_types)
    if ShardingType.ROW_WISE.value not in sharding_types:
        sharding_types.append(ShardingType.ROW_WISE.value)
    return sharding_types


def _with_customized_kernel(kernels: list[str], sharding_type: str) -> list[str]:
    kernels = list(kernels)
    customized = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    if sharding_type == ShardingType.ROW_WISE.value and customized not in kernels:
        kernels.append(customized)
    return kernels


class _RawIdRanges(logging.Filter):
    """Drops TorchRec's first-batch notice that a feature's ids lie outside
    [0, num_embeddings) for the features of dynamic tables, whose raw ids do
    by design (``torchrec.sparse.jagged_tensor_validator``); the notice of
    every other feature passes."""

    def __init__(self) -> None:
        super().__init__()
        self.features: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(f"Feature {f} has range ") for f in self.features)


_RAW_ID_RANGES = _RawIdRanges()
logging.getLogger("torchrec.sparse.jagged_tensor_validator").addFilter(_RAW_ID_RANGES)


def _refuse_foreign_enumerator(sharder: Any, caller: Any) -> None:
    """Raises when ``caller`` (the object asking a sharder for its kernels) is
    an enumerator of TorchRec's that is not dynamicemb's: its planner cannot
    estimate a dynamic table's kernel, nor write the plan entries dynamic
    tables are built from."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    from ..planner.enumerator import DynamicEmbeddingEnumerator

    if isinstance(caller, EmbeddingEnumerator) and not isinstance(
        caller, DynamicEmbeddingEnumerator
    ):
        raise ValueError(
            f"{type(caller).__name__} is planning with {type(sharder).__name__}: a model "
            "sharded with the dynamicemb sharders is planned by "
            "dynamicemb.planner.DynamicEmbeddingShardingPlanner (TorchRec's planner with the "
            "same arguments plus eb_configs, the model's table configs; it plans TorchRec's "
            "tables as TorchRec does), whose DynamicEmbeddingEnumerator gives the dynamic "
            "tables their kernel and options. TorchRec's EmbeddingShardingPlanner cannot "
            "plan dynamic tables; for a model without them, use TorchRec's own sharders."
        )


class _DynamicSharderMixin:
    """What both sharders add to TorchRec's: ROW_WISE sharding and, for it,
    the ``CUSTOMIZED_KERNEL`` compute kernel. Asked for its kernels by the
    enumerator of another planner than ``DynamicEmbeddingShardingPlanner``
    (TorchRec's ``EmbeddingShardingPlanner``), it refuses, naming the planner
    to use."""

    def __init__(
        self, *args: Any, static_fused_params: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.static_fused_params = (
            None if static_fused_params is None else dict(static_fused_params)
        )

    def _module_fused_params(self) -> dict[str, Any] | None:
        """The fused_params its sharded modules get (the static ones carried
        along, see ``_DynamicTablesMixin.create_grouped_sharding_infos``)."""
        if self.static_fused_params is None:
            return self.fused_params
        return {**(self.fused_params or {}), STATIC_FUSED_PARAMS: self.static_fused_params}

    def _sharded_module_args(self) -> dict[str, Any]:
        """The sharded module's constructor arguments that only one
        collection's takes (TorchRec's sharder passes them likewise)."""
        raise NotImplementedError

    def shard(
        self,
        module: Any,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> Any:
        # TorchRec's shard, with the sharded module of dynamic tables
        # (sharded_module_type) and the fused_params it reads.
        return self.sharded_module_type(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self._module_fused_params(),
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            **self._sharded_module_args(),
        )

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return _with_row_wise(super().sharding_types(compute_device_type))

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        caller = inspect.currentframe().f_back
        _refuse_foreign_enumerator(self, caller.f_locals.get("self"))
        return _with_customized_kernel(
            super().compute_kernels(sharding_type, compute_device_type), sharding_type
        )


class DynamicEmbeddingCollectionSharder(_DynamicSharderMixin, EmbeddingCollectionSharder):
    """TorchRec's ``EmbeddingCollectionSharder`` for collections with dynamic tables.

    Used like the parent (``fused_params`` with the optimizer type and its
    arguments, ``qcomm_codecs_registry``, ``use_index_dedup``). Tables whose
    plan entry is a ``DynamicEmbParameterSharding`` become hash-table-backed
    row-wise tables; the others are sharded by TorchRec. Lists
    ``CUSTOMIZED_KERNEL`` among the row-wise compute kernels, the kernel the
    planner gives dynamic tables; planned by ``DynamicEmbeddingShardingPlanner``
    (TorchRec's own planner is refused, naming it).

    Args:
        fused_params (Optional[Dict[str, Any]]): the dynamic tables' fused
            optimizer and its arguments; they reach the dynamic tables only.
        static_fused_params (Optional[Dict[str, Any]]): the fused params of
            TorchRec's tables in the same collections (what TorchRec's own
            sharder's ``fused_params`` would be). Without it they take
            ``fused_params``, as TorchRec's own sharder gives them to every
            table; needed when ``fused_params`` name an optimizer TorchRec's
            kernels lack (a ``DynamicEmbOptimType``), or one its kernel lacks
            on the device (Adam on the CPU).
        **kwargs: the parent's (``qcomm_codecs_registry``, ``use_index_dedup``).

    Example::

        sharder = DynamicEmbeddingCollectionSharder(
            fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": 1e-3},
            static_fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1},
            use_index_dedup=True,
        )
    """

    def _sharded_module_args(self) -> dict[str, Any]:
        return {"use_index_dedup": self._use_index_dedup}

    @property
    def sharded_module_type(self) -> type[ShardedDynamicEmbeddingCollection]:
        return ShardedDynamicEmbeddingCollection


class DynamicEmbeddingBagCollectionSharder(_DynamicSharderMixin, EmbeddingBagCollectionSharder):
    """TorchRec's ``EmbeddingBagCollectionSharder`` for collections with dynamic tables.

    Used like the parent. Dynamic tables (plan entries that are
    ``DynamicEmbParameterSharding``) pool SUM or MEAN; a weighted collection
    (``is_weighted=True``) passes the KJT weights as pooling weights, an
    unweighted one ignores them. Offers ROW_WISE sharding on every device
    (TorchRec's parent offers it on CUDA only) and ``CUSTOMIZED_KERNEL`` among
    its compute kernels. ``fused_params`` and ``static_fused_params`` as for
    ``DynamicEmbeddingCollectionSharder``: the first reach the dynamic tables
    only, the second TorchRec's.

    Example::

        fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
        sharder = DynamicEmbeddingBagCollectionSharder(
            fused_params=fused, static_fused_params=fused
        )
        model = DistributedModelParallel(model, plan=plan, sharders=[sharder])
    """

    def _sharded_module_args(self) -> dict[str, Any]:
        order = getattr(self, "_sharded_module_order_overwrite", None)
        return {} if order is None else {"sharded_module_order_overwrite": order}

    @property
    def sharded_module_type(self) -> type[ShardedDynamicEmbeddingBagCollection]:
        return ShardedDynamicEmbeddingBagCollection

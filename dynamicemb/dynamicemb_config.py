"""Configuration of dynamic embedding tables.

The per-table options (``DynamicEmbTableOptions``), initializer arguments,
the public enums, and the sizing rules the sharding planner applies to them:

* ``complete_initializer_args``: fill missing UNIFORM / TRUNCATED_NORMAL bounds.
* ``get_sharded_table_capacity``: per-rank row capacity after sharding and
  bucket alignment (what the planner writes to ``max_capacity``).
* ``get_table_value_bytes``: bytes of all ranks' value rows (embedding and
  optimizer state), to size ``global_hbm_for_values``.
* ``optimizer_state_dim``: the one rule for the optimizer-state width of a
  row; ``value_row_bytes``: the one rule for the bytes of a row (embedding at
  its dtype, padded to 4 bytes, then the optimizer state in float32).

This module needs only torch. TorchRec / FBGEMM objects (embedding configs,
``EmbOptimType``) are accepted where the API takes them, and their modules are
imported only when such an object has to be interpreted.
"""

import dataclasses
import enum
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._checks import as_real
from ._checks import is_int as _is_int
from ._enums import (
    BUCKET_ALIGNMENT,
    DynamicEmbEvictStrategy,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)
from ._warnings import warn_once
from .types import (
    AdmissionStrategy,
    Counter,
    EvictedItemMode,
    MemoryType,
    Storage,
)

__all__ = [
    "BUCKET_ALIGNMENT",
    "DEFAULT_BUCKET_CAPACITY",
    "DEFAULT_DIST_TYPE",
    "DEFAULT_INDEX_TYPE",
    "DIST_TYPES",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbCheckMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbOptimType",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "MemoryType",
    "ReplayContent",
    "align_to_table_size",
    "complete_initializer_args",
    "get_sharded_table_capacity",
    "EMBEDDING_DTYPES",
    "MAX_SCALED_DIM",
    "OPTIMIZER_STATE_DTYPE",
    "SCALED_DTYPES",
    "embedding_config_dtype",
    "get_table_value_bytes",
    "implemented_optimizers",
    "native_optimizer",
    "optimizer_state_dim",
    "embedding_row_bytes",
    "value_row_bytes",
]

# Bucket width meaning "one bucket spanning the whole per-rank shard".
MAX_BUCKET_CAPACITY = 2**63 - 1

# Slots per bucket when the user does not say.
DEFAULT_BUCKET_CAPACITY = 128

# Index (sparse feature id) dtype a table uses when index_type is None.
DEFAULT_INDEX_TYPE = torch.int64

# Row-wise key -> rank routing of a sharded table.
DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")
DEFAULT_DIST_TYPE = "roundrobin"

# Bytes the fused row layout reserves for a row-wise optimizer's state
# (row-wise Adagrad fills one float32 of them, RMSprop AR three; the rest
# keeps rows aligned). cc/embedding/optimizer.h's kRowStateFloats.
_ROWWISE_STATE_BYTES = 16

# The dtypes a table's embeddings may be stored at.
EMBEDDING_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)

# The embedding dtypes whose rows carry a scale: a row of FP8 codes, padded to
# 4 bytes, then its float32 scale (cc/storage/row_space.h, "FP8 rows").
SCALED_DTYPES = (torch.float8_e4m3fn,)

# The widest row of a scaled dtype (cc/storage/row_space.h, kMaxScaledDim: a
# GPU warp keeps a row's new values in registers until its scale is known).
MAX_SCALED_DIM = 512

# The dtype of the optimizer state in a row, whatever the embedding's: the
# arithmetic is float32 (as FBGEMM keeps float32 state next to float16 weights).
OPTIMIZER_STATE_DTYPE = torch.float32

# A row's embedding is padded to a multiple of this many bytes, so that the
# float32 state after it is aligned (cc/storage/row_space.h, state_offset).
_ROW_ALIGNMENT = 4

# The only compound score strategy: a timestamp column and an LFU column.
_COMPOUND_SCORE_STRATEGY = frozenset(
    {DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU}
)


@enum.unique
class DynamicEmbCheckMode(enum.IntEnum):
    """What to do when keys of a batch cannot be inserted into the table.

    A key whose home bucket is full of keys that may not be evicted cannot be
    inserted; its lookup result is then all zeros. This is rare in a large
    table and frequent in a small one. Whatever the mode, failures are
    counted per table on the device (the module's ``insert_failures``, the
    metric ``dynamicemb.table.insert_failures``); the mode says what the
    training step does about them.

    Attributes:
        ERROR (int): read the step's failures (one synchronization a step)
            and raise a RuntimeError naming each failing table and how many
            of its keys failed.
        WARNING (int): read the step's failures (one synchronization a step),
            continue (failed keys read 0.0) and warn naming the table, at
            its 1st, 2nd, 4th, 8th, ... failing step.
        IGNORE (int): read nothing in the step (no overhead); failed keys
            read 0.0. The counters are copied to the host without waiting,
            and the first failures of a table are said once, in a warning
            naming the table, the count and the option that fixes it.
    """

    ERROR = 0
    WARNING = 1
    IGNORE = 2


@enum.unique
class DynamicEmbInitializerMode(enum.Enum):
    """How a new embedding row is initialized.

    Attributes:
        NORMAL (str): normal distribution (``mean``, ``std_dev``).
        TRUNCATED_NORMAL (str): normal distribution truncated to
            [``lower``, ``upper``].
        UNIFORM (str): uniform distribution on [``lower``, ``upper``).
        CONSTANT (str): every element is ``value``.
        DEBUG (str): deterministic values derived from the key, for tests.
    """

    NORMAL = "normal"
    TRUNCATED_NORMAL = "truncated_normal"
    UNIFORM = "uniform"
    CONSTANT = "constant"
    DEBUG = "debug"


@enum.unique
class DynamicEmbOptimType(enum.Enum):
    """Optimizers dynamicemb implements that FBGEMM's ``EmbOptimType`` lacks.

    Accepted wherever an optimizer type is (the ``optimizer`` entry of
    ``fused_params``). A plain ``Enum``, so its members never compare equal
    to an ``EmbOptimType`` member nor to their string values.

    Attributes:
        FTRL (str): FTRL-Proximal; per-row state is ``linear`` then ``accum``,
            ``2 * dim`` elements.
        ROWWISE_RMSPROP_AR (str): row-wise RMSprop with adaptive
            regularization (FBGEMM's ``ROWWISE_RMSPROP_AR``, whose
            ``EmbOptimType`` member newer FBGEMM releases have and is accepted
            as well): a row's weights shrink by the steps since its last
            update; ``fused_params`` take ``ar_alpha``, ``ema_beta``,
            ``min_shrinkage`` and ``row_warmup_steps`` (a new row's step size
            ramps up over its first updates). Per-row state: 16 bytes, of
            which three float32 (the EMA of mean(g^2), the step of the last
            update, the updates since insertion).
    """

    FTRL = "ftrl"
    ROWWISE_RMSPROP_AR = "row_wise_rmsprop_ar"


@enum.unique
class ReplayContent(enum.Flag):
    """What ``replay_increment`` writes besides the embedding, which it always does.

    Attributes:
        EMBEDDING_ONLY: neither optimizer state nor scores.
        OPTIMIZER_STATE: the optimizer state of each replayed row.
        SCORE: the score words of each replayed key.
        ALL: ``OPTIMIZER_STATE | SCORE``.
    """

    EMBEDDING_ONLY = 0
    OPTIMIZER_STATE = enum.auto()
    SCORE = enum.auto()
    ALL = OPTIMIZER_STATE | SCORE


@dataclass
class DynamicEmbInitializerArgs:
    """Arguments for initializing dynamic embedding rows.

    ``lower``/``upper`` left as None are completed by
    ``complete_initializer_args``: for UNIFORM and TRUNCATED_NORMAL,
    ``±sqrt(1 / num_embeddings)`` given the table's embedding config, else
    0.0 and 1.0 (UNIFORM) or ``mean ∓ 2 * std_dev`` (TRUNCATED_NORMAL).

    Attributes:
        mode (DynamicEmbInitializerMode): the initialization. A string value
            (``"uniform"``) is converted. Defaults to UNIFORM.
        mean (float): mean of NORMAL / TRUNCATED_NORMAL. Defaults to 0.0.
        std_dev (float): standard deviation of NORMAL / TRUNCATED_NORMAL.
            Defaults to 1.0.
        lower (Optional[float]): lower bound of UNIFORM / TRUNCATED_NORMAL.
            Defaults to None (completed later).
        upper (Optional[float]): upper bound of UNIFORM / TRUNCATED_NORMAL.
            Defaults to None (completed later).
        value (float): the constant of CONSTANT. Defaults to 0.0.

    Raises:
        ValueError: ``mode`` is not a DynamicEmbInitializerMode (or its
            value), a number is NaN or infinite, ``std_dev`` is negative, or
            both bounds are set and ``lower > upper``.
        TypeError: ``mean``, ``std_dev``, ``value`` or a bound is not a real
            number (a string, a bool, None where a number is required).
    """

    mode: DynamicEmbInitializerMode = DynamicEmbInitializerMode.UNIFORM
    mean: float = 0.0
    std_dev: float = 1.0
    lower: float | None = None
    upper: float | None = None
    value: float = 0.0

    def __post_init__(self) -> None:
        self.mode = _to_enum(DynamicEmbInitializerMode, self.mode, "mode")
        for name in ("mean", "std_dev", "lower", "upper", "value"):
            v = getattr(self, name)
            if v is None and name in ("lower", "upper"):
                continue
            as_real(v, f"DynamicEmbInitializerArgs.{name}", min=0.0 if name == "std_dev" else None)
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise ValueError(
                f"DynamicEmbInitializerArgs: lower ({self.lower!r}) must not exceed "
                f"upper ({self.upper!r})"
            )


ScoreStrategy = DynamicEmbScoreStrategy | tuple[DynamicEmbScoreStrategy, ...]


@dataclass
class DynamicEmbTableOptions:
    """Configuration of one dynamic embedding table.

    Passed to ``DynamicEmbParameterConstraints`` as ``dynamicemb_options``.
    Fields listed first (through ``device_id``) are usually filled by the
    sharding planner or the runtime rather than set by the user.
    ``get_grouped_key`` returns the fields that must agree for tables to be
    fused into one module.

    Attributes:
        embedding_dtype (Optional[torch.dtype]): dtype the embeddings are
            stored at: float32, float16, bfloat16 or ``torch.float8_e4m3fn``
            (FP8: e4m3fn codes with a float32 power-of-two scale per row,
            written by stochastic rounding; dim at most ``MAX_SCALED_DIM``)
            (None: float32, or in a sharded model the table config's
            ``data_type``). The optimizer state and the arithmetic stay
            float32 (``value_row_bytes``). Also the precision a checkpoint
            stores.
        dim (Optional[int]): embedding width; the planner sets it from
            ``BaseEmbeddingConfig.embedding_dim``, the embedding kernel from
            the sharded ``local_cols``. A value given that differs only
            warns, and the table is built with the columns.
        max_capacity (Optional[int]): most rows of this table on one rank; the
            planner sets it to ``get_sharded_table_capacity(...)``.
        evict_strategy (DynamicEmbEvictStrategy): kept for compatibility and
            without effect: a table evicts by ``score_strategy`` (a value other
            than LRU warns once, naming it). Defaults to LRU.
        local_hbm_for_values (int): bytes of device memory for this rank's
            values; the planner sets it to
            ``ceil(global_hbm_for_values / world_size)``. Defaults to 0.
        device_id (Optional[int]): device index of the table.
        training (bool): training mode: rows hold the optimizer state after the
            embedding (``value = concat(embedding, optimizer_state)``), whose
            width follows the ``optimizer`` of ``fused_params``
            (``optimizer_state_dim``). Defaults to True.
        initializer_args (DynamicEmbInitializerArgs): how a row new in
            training is initialized. Defaults to UNIFORM with bounds completed
            by the planner (``complete_initializer_args``).
        eval_initializer_args (DynamicEmbInitializerArgs): how a key missing in
            evaluation is looked up. Defaults to CONSTANT 0.0.
        caching (bool): True: a device table caches hot keys in front of a
            host table, evicting from the device into the host table. False:
            one hybrid table whose value rows are split between device and
            host memory by key hash. Keys and metadata are on the device in
            both cases. Defaults to False.
        init_capacity (Optional[int]): initial rows on one rank; the table
            doubles (rehash) up to ``max_capacity`` as it fills. None means
            ``max_capacity``; the planner aligns it to ``bucket_capacity`` and
            clamps it to ``max_capacity``.
        max_load_factor (float): load factor in (0, 1] above which the table
            doubles. Ignored under NO_EVICTION (whose key map keeps
            ``dynamicemb.table.NO_EVICTION_LOAD_FACTOR``). Defaults to 0.5.
        score_strategy (DynamicEmbScoreStrategy or tuple): how keys are
            scored for eviction: one ``DynamicEmbScoreStrategy`` or a tuple of
            them; must be the same on every rank of a table. A tuple is a
            compound strategy keeping one score per element; only
            ``(TIMESTAMP, LFU)`` in either order is supported (eviction by
            frequency, ties by older timestamp, plus a timestamp for
            time-based ``incremental_dump``). The tuple order is the order of
            the score columns in dumps and in ``score_function``'s ``scores``.
            A one-element tuple ``(X,)`` is stored as ``X``. Defaults to
            TIMESTAMP.
        bucket_capacity (int): slots per hash bucket. A key lives only in its
            home bucket; a full bucket evicts its minimum-score key. A
            multiple of ``BUCKET_ALIGNMENT`` (16), or ``MAX_BUCKET_CAPACITY``
            for one bucket spanning the shard. Larger buckets evict more
            accurately and run slower. Defaults to 128 (a device cache in
            front of a host table uses 1024).
        safe_check_mode (DynamicEmbCheckMode): what a training step does
            about keys that could not be inserted (counted per table in every
            mode). Defaults to IGNORE (said once per table, nothing read in
            the step).
        global_hbm_for_values (int): bytes of device memory for the values of
            the whole table over all ranks (``caching=False``: the device part
            of the hybrid table; ``caching=True``: the size of the device
            cache). Size it with ``get_table_value_bytes``. Defaults to 0.
        external_storage (Optional[Type[Storage]]): a subclass of ``Storage``
            keeping this table's rows instead of dynamicemb's hash table; the
            module constructs it. Defaults to None.
        index_type (Optional[torch.dtype]): integer dtype of the sparse
            feature ids; None means ``DEFAULT_INDEX_TYPE`` (torch.int64).
        admit_strategy (Optional[AdmissionStrategy]): which missing keys may
            enter the table; rejected keys are initialized and used in the
            forward but not stored. Defaults to None (admit all).
        admission_counter (Optional[Counter]): deprecated; warns when set. Give
            the counter to the admission strategy instead. A
            ``FrequencyAdmissionStrategy`` without a counter of its own is
            replaced by a copy counting into this one (the field is then
            None); a strategy whose own counter differs raises ValueError.
        evicted_item_mode (EvictedItemMode): what the last storage tier does
            with the keys it evicts: DISCARD them, or RETAIN_KEY for
            ``pop_evicted_keys``. Defaults to DISCARD.
        score_function (Optional[Callable]): custom eviction ranking for the
            compound ``{TIMESTAMP, LFU}`` strategy only:
            ``score_function(scores, cur_timestamp) -> float64``, ``scores``
            indexed in ``score_strategy`` tuple order; the lowest score is
            evicted first. Compiled to device code (numba-cuda) when a table
            is built. Defaults to None (frequency, then older timestamp).
        dist_type (str): row-wise key -> rank routing, one of ``DIST_TYPES``:
            ``"continuous"``, ``"roundrobin"`` or ``"hash_roundrobin"`` (hashes
            the key first). Defaults to ``"roundrobin"``.
        refuse_cold_keys (bool): a new key whose score would be below the
            lowest score of its full bucket is not inserted (it evicts
            nothing): in the training step it reads the row admission's
            rejected keys read (the strategy's ``initializer_args``, else the
            table's initializer), is not trained, and is counted in the
            REFUSALS figure (``dynamicemb.table.refusals``). Deterministic,
            the same on the CPU and the GPU. It changes what LFU, CUSTOMIZED
            and the compound (TIMESTAMP, LFU) keep; a TIMESTAMP or STEP
            newcomer is never below a resident key. On HierarchicalKV's
            admission protocol (a quarter of the slots in new keys arriving
            at load 0.96; measured at 1/64 of its 16M slots on the CPU) it
            keeps every resident key an LFU table would lose, 21.9 points of
            hit rate (docs/benchmarks/eviction.md). Not with ``caching``, an
            ``external_storage``, a ``score_function`` or NO_EVICTION.
            Defaults to False (a newcomer evicts the bucket's lowest).

    Raises:
        ValueError: a field has a bad value; the message names it.
        TypeError: a field has the wrong kind of object.

    Example::

        from dynamicemb import (DynamicEmbInitializerArgs, DynamicEmbInitializerMode,
                                DynamicEmbScoreStrategy, DynamicEmbTableOptions)
        from dynamicemb.planner import DynamicEmbParameterConstraints

        options = DynamicEmbTableOptions(
            score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,  # evict the least recent
            initializer_args=DynamicEmbInitializerArgs(
                mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.01, upper=0.01),
            global_hbm_for_values=1 << 30,  # bytes of rows on the devices, all ranks
        )
        constraints = {"user": DynamicEmbParameterConstraints(
            sharding_types=["row_wise"], use_dynamicemb=True, dynamicemb_options=options)}
    """

    embedding_dtype: torch.dtype | None = None
    dim: int | None = None
    max_capacity: int | None = None
    evict_strategy: DynamicEmbEvictStrategy = DynamicEmbEvictStrategy.LRU
    local_hbm_for_values: int = 0  # in bytes
    device_id: int | None = None
    training: bool = True
    initializer_args: DynamicEmbInitializerArgs = field(default_factory=DynamicEmbInitializerArgs)
    eval_initializer_args: DynamicEmbInitializerArgs = field(
        default_factory=lambda: DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.CONSTANT,
            value=0.0,
        )
    )
    caching: bool = False
    init_capacity: int | None = None  # None: max_capacity after sharding
    max_load_factor: float = 0.5  # before rehash (doubling the capacity)
    score_strategy: ScoreStrategy = DynamicEmbScoreStrategy.TIMESTAMP
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY
    safe_check_mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE
    global_hbm_for_values: int = 0  # in bytes
    external_storage: type[Storage] | None = None
    index_type: torch.dtype | None = None
    admit_strategy: AdmissionStrategy | None = None
    admission_counter: Counter | None = None  # deprecated
    evicted_item_mode: EvictedItemMode = EvictedItemMode.DISCARD
    # Not in the spec's field listing; appended so that every listed field
    # keeps its listed position.
    score_function: Callable | None = None
    dist_type: str = DEFAULT_DIST_TYPE
    refuse_cold_keys: bool = False

    def __post_init__(self) -> None:
        self.evict_strategy = _to_enum(
            DynamicEmbEvictStrategy, self.evict_strategy, "evict_strategy"
        )
        self.safe_check_mode = _to_enum(
            DynamicEmbCheckMode, self.safe_check_mode, "safe_check_mode"
        )
        self.evicted_item_mode = _to_enum(
            EvictedItemMode, self.evicted_item_mode, "evicted_item_mode"
        )
        self.score_strategy = _normalize_score_strategy(self.score_strategy)
        if self.score_function is not None:
            if not callable(self.score_function):
                raise TypeError(
                    "DynamicEmbTableOptions.score_function must be callable, "
                    f"got {self.score_function!r}"
                )
            if self.num_scores() != 2:
                raise ValueError(
                    "DynamicEmbTableOptions.score_function is supported only with the "
                    "compound score_strategy (TIMESTAMP, LFU) in either order, got "
                    f"score_strategy={self.score_strategy!r}"
                )
        _check_bucket_capacity(self.bucket_capacity, "DynamicEmbTableOptions.bucket_capacity")
        if (
            not isinstance(self.max_load_factor, (int, float))
            or isinstance(self.max_load_factor, bool)
            or not 0.0 < self.max_load_factor <= 1.0
        ):
            raise ValueError(
                "DynamicEmbTableOptions.max_load_factor must be in (0, 1], "
                f"got {self.max_load_factor!r}"
            )
        for name in ("training", "caching", "refuse_cold_keys"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"DynamicEmbTableOptions.{name} must be a bool, got {getattr(self, name)!r}"
                )
        for name in ("dim", "max_capacity", "init_capacity"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise ValueError(
                    f"DynamicEmbTableOptions.{name} must be a positive int or None, got {value!r}"
                )
        for name in ("local_hbm_for_values", "global_hbm_for_values"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(
                    f"DynamicEmbTableOptions.{name} must be a non-negative int (bytes), "
                    f"got {value!r}"
                )
        if self.embedding_dtype is not None and self.embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(
                "DynamicEmbTableOptions.embedding_dtype must be one of "
                f"{EMBEDDING_DTYPES} or None, got {self.embedding_dtype!r}"
            )
        if (
            self.embedding_dtype in SCALED_DTYPES
            and self.dim is not None
            and self.dim > MAX_SCALED_DIM
        ):
            raise ValueError(
                f"DynamicEmbTableOptions: a {self.embedding_dtype} row has at most "
                f"{MAX_SCALED_DIM} elements, got dim {self.dim}"
            )
        if self.index_type is not None and not _is_integer_dtype(self.index_type):
            raise ValueError(
                "DynamicEmbTableOptions.index_type must be an integer torch.dtype "
                f"or None, got {self.index_type!r}"
            )
        for name in ("initializer_args", "eval_initializer_args"):
            value = getattr(self, name)
            if not isinstance(value, DynamicEmbInitializerArgs):
                raise TypeError(
                    f"DynamicEmbTableOptions.{name} must be a DynamicEmbInitializerArgs, "
                    f"got {value!r}"
                )
        if isinstance(self.external_storage, Storage):
            cls = type(self.external_storage).__qualname__
            raise TypeError(
                f"DynamicEmbTableOptions.external_storage got an instance of {cls}; pass the "
                f"class {cls} itself: the module constructs it as {cls}(tables, device), one "
                "per fused module"
            )
        if self.external_storage is not None and not (
            isinstance(self.external_storage, type) and issubclass(self.external_storage, Storage)
        ):
            raise TypeError(
                "DynamicEmbTableOptions.external_storage must be a subclass of "
                f"dynamicemb.types.Storage (the class, not an instance), got "
                f"{self.external_storage!r}"
            )
        self._check_refuse_cold_keys()
        if self.admit_strategy is not None and not isinstance(
            self.admit_strategy, AdmissionStrategy
        ):
            raise TypeError(
                "DynamicEmbTableOptions.admit_strategy must be an AdmissionStrategy "
                f"or None, got {self.admit_strategy!r}"
            )
        if self.admission_counter is not None:
            self._carry_admission_counter()
        if self.dist_type not in DIST_TYPES:
            raise ValueError(
                f"DynamicEmbTableOptions.dist_type must be one of {DIST_TYPES}, "
                f"got {self.dist_type!r}"
            )
        _warn_ignored_options(self)

    def _carry_admission_counter(self) -> None:
        """The deprecated ``admission_counter``: warns, and hands the counter to
        the admission strategy that counts (a copy of it: one strategy object
        may serve several tables), which then holds it alone."""
        counter = self.admission_counter
        carried = None
        if self.admit_strategy is not None:
            carried = self.admit_strategy.with_deprecated_counter(counter)
        where = (
            "it was carried to the admission strategy"
            if carried is not None
            else "it has no effect: no admission strategy that counts was given"
        )
        warnings.warn(
            "DynamicEmbTableOptions.admission_counter is deprecated; pass the "
            "counter to the admission strategy that uses it instead "
            "(e.g. FrequencyAdmissionStrategy(threshold=..., counter=KVCounter(...))); "
            f"{where}.",
            DeprecationWarning,
            stacklevel=4,
        )
        if carried is not None:
            self.admit_strategy = carried
            self.admission_counter = None

    def _check_refuse_cold_keys(self) -> None:
        """refuse_cold_keys only where a table's own full buckets decide."""
        if not self.refuse_cold_keys:
            return
        conflicts = [
            (self.caching, "caching=True"),
            (self.external_storage is not None, "an external_storage"),
            (self.score_function is not None, "a score_function"),
            (
                DynamicEmbScoreStrategy.NO_EVICTION in self.score_strategies(),
                "score_strategy NO_EVICTION (it never evicts)",
            ),
        ]
        for conflict, what in conflicts:
            if conflict:
                raise ValueError(
                    f"DynamicEmbTableOptions.refuse_cold_keys is not supported with {what}"
                )

    def score_strategies(self) -> tuple[DynamicEmbScoreStrategy, ...]:
        """The score strategy as a tuple, one element per score word.

        Returns:
            Tuple[DynamicEmbScoreStrategy, ...]: ``(X,)`` for a single
            strategy, the configured tuple (in its order) for a compound one.
        """
        if isinstance(self.score_strategy, tuple):
            return self.score_strategy
        return (self.score_strategy,)

    def num_scores(self) -> int:
        """Score words kept per key: 1, or 2 for the compound (TIMESTAMP, LFU)."""
        return len(self.score_strategies())

    def effective_index_type(self) -> torch.dtype:
        """``index_type``, or ``DEFAULT_INDEX_TYPE`` when it is None."""
        return self.index_type if self.index_type is not None else DEFAULT_INDEX_TYPE

    def get_grouped_key(self) -> tuple[tuple[str, Any], ...]:
        """What has to match for tables to be fused into one module.

        A fused module holds one hash table, one value layout and one
        admitter for all its tables, so everything those are built from must
        agree. What is resolved per table (dim, capacities, memory budgets,
        initializers, device) is left out.

        Returns:
            Tuple[Tuple[str, Any], ...]: hashable ``(name, value)`` pairs.
        """
        admit_key = None
        if self.admit_strategy is not None:
            admit_key = (
                type(self.admit_strategy),
                self.admit_strategy.get_grouped_key(),
            )
        return (
            ("embedding_dtype", self.embedding_dtype),
            ("training", self.training),
            ("caching", self.caching),
            ("evict_strategy", self.evict_strategy),
            ("score_strategy", self.score_strategy),
            ("score_function", self.score_function),
            ("bucket_capacity", self.bucket_capacity),
            ("max_load_factor", self.max_load_factor),
            ("safe_check_mode", self.safe_check_mode),
            ("index_type", self.effective_index_type()),
            ("admit_strategy", admit_key),
            ("external_storage", self.external_storage),
            ("evicted_item_mode", self.evicted_item_mode),
            ("dist_type", self.dist_type),
            ("refuse_cold_keys", self.refuse_cold_keys),
        )


def _warn_ignored_options(options: DynamicEmbTableOptions) -> None:
    """Options a table accepts but does not act on, when set to something a
    user would expect to matter: a warning each, once per process."""
    ignored = []
    if options.evict_strategy != DynamicEmbEvictStrategy.LRU:
        ignored.append(
            (
                "evict_strategy",
                f"evict_strategy={options.evict_strategy.name} has no effect: a table evicts "
                f"by its score_strategy ({options.score_strategy!r}); set score_strategy "
                "instead (e.g. DynamicEmbScoreStrategy.LFU to evict the least frequently "
                "used key)",
            )
        )
    if options.device_id is not None:
        ignored.append(
            (
                "device_id",
                f"device_id={options.device_id!r} has no effect: a table lives on the device "
                "of its module (BatchedDynamicEmbeddingTablesV2's device, or the device "
                "DistributedModelParallel shards onto)",
            )
        )
    if options.index_type not in (None, DEFAULT_INDEX_TYPE):
        ignored.append(
            (
                "index_type",
                f"index_type={options.index_type} has no effect: keys are stored as "
                f"{DEFAULT_INDEX_TYPE}, and indices of any integer dtype are accepted",
            )
        )
    for name, message in ignored:
        warn_once(
            f"DynamicEmbTableOptions.{name}", f"DynamicEmbTableOptions.{message}.", stacklevel=4
        )


def _warn_ignored_weight_init(embedding_config: Any) -> None:
    """TorchRec's ``weight_init_min`` / ``weight_init_max`` of a dynamic table's
    config are not used (the bounds come from ``initializer_args``): say so once."""
    bounds = {
        name: getattr(embedding_config, name, None)
        for name in ("weight_init_min", "weight_init_max")
    }
    bounds = {k: v for k, v in bounds.items() if v is not None}
    if bounds:
        name = getattr(embedding_config, "name", "?")
        warn_once(
            "weight_init",
            f"embedding config {name!r}: {bounds} has no effect on a dynamic table: its rows "
            "are initialized by DynamicEmbTableOptions.initializer_args (for UNIFORM, unset "
            "bounds become -/+sqrt(1 / num_embeddings)); set lower / upper there instead.",
            stacklevel=4,
        )


# The modes whose bounds complete_initializer_args fills.
_BOUNDED_MODES = (DynamicEmbInitializerMode.UNIFORM, DynamicEmbInitializerMode.TRUNCATED_NORMAL)


def complete_initializer_args(
    initializer_args: DynamicEmbInitializerArgs,
    embedding_config: Any | None = None,
) -> DynamicEmbInitializerArgs:
    """Fill the missing bounds of UNIFORM and TRUNCATED_NORMAL initializer
    arguments.

    Step 1 of the planner's option preparation. A ``lower`` or ``upper`` that
    is None becomes ``-sqrt(1 / num_embeddings)`` / ``+sqrt(1 /
    num_embeddings)`` when ``embedding_config`` is given (the options'
    documented default for both modes), else 0.0 / 1.0 for UNIFORM and
    ``mean - 2 * std_dev`` / ``mean + 2 * std_dev`` for TRUNCATED_NORMAL. A
    bound already set is kept. The argument is never modified.
    The config's ``weight_init_min`` / ``weight_init_max`` (TorchRec's) are
    not used; set, they warn once.

    Args:
        initializer_args (DynamicEmbInitializerArgs): the table's arguments.
        embedding_config (Optional[BaseEmbeddingConfig]): the table's global
            TorchRec config (its ``num_embeddings`` sets the bounds).

    Returns:
        DynamicEmbInitializerArgs: a new object with the bounds filled, or
        ``initializer_args`` itself when there is nothing to fill (other
        modes, or both bounds set).

    Raises:
        ValueError: the completed bounds have ``lower > upper``, or the
            config's ``num_embeddings`` is not a positive int.
    """
    if embedding_config is not None:
        _warn_ignored_weight_init(embedding_config)
    mode = initializer_args.mode
    if mode not in _BOUNDED_MODES or (
        initializer_args.lower is not None and initializer_args.upper is not None
    ):
        return initializer_args
    if embedding_config is not None:
        bound = math.sqrt(1.0 / _num_embeddings(embedding_config))
        default_lower, default_upper = -bound, bound
    elif mode == DynamicEmbInitializerMode.UNIFORM:
        default_lower, default_upper = 0.0, 1.0
    else:
        spread = 2.0 * initializer_args.std_dev
        default_lower = initializer_args.mean - spread
        default_upper = initializer_args.mean + spread
    return dataclasses.replace(
        initializer_args,
        lower=default_lower if initializer_args.lower is None else initializer_args.lower,
        upper=default_upper if initializer_args.upper is None else initializer_args.upper,
    )


def align_to_table_size(size: int, bucket_capacity: int) -> int:
    """Rows of a table of whole buckets that holds ``size`` rows.

    ``size`` rounded up to a multiple of ``bucket_capacity``, and at least one
    bucket: ``max(1, ceil(size / bucket_capacity)) * bucket_capacity``. (Not a
    power of two: a key's home bucket is ``hash(key) % capacity //
    bucket_capacity``, which needs only whole buckets.)

    Args:
        size (int): rows wanted, >= 0.
        bucket_capacity (int): slots per bucket, > 0.

    Returns:
        int: the aligned row count.

    Raises:
        ValueError: ``size`` is negative or ``bucket_capacity`` not positive.
    """
    if not _is_int(size) or size < 0:
        raise ValueError(f"align_to_table_size: size must be an int >= 0, got {size!r}")
    if not _is_int(bucket_capacity) or bucket_capacity <= 0:
        raise ValueError(
            f"align_to_table_size: bucket_capacity must be an int > 0, got {bucket_capacity!r}"
        )
    return max(1, _ceil_div(size, bucket_capacity)) * bucket_capacity


def _sharded_table_bucket_layout(
    embedding_config: Any,
    world_size: int,
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY,
) -> tuple[int, int]:
    """Per-rank bucket layout of a row-wise sharded table.

    Each rank holds ``ceil(num_embeddings / world_size)`` rows, laid out as:

    * ``bucket_capacity == MAX_BUCKET_CAPACITY``: one bucket whose width is
      those rows rounded up to a multiple of ``BUCKET_ALIGNMENT``.
    * otherwise: ``align_to_table_size(rows, bucket_capacity) //
      bucket_capacity`` buckets of ``bucket_capacity`` slots.

    Args:
        embedding_config (BaseEmbeddingConfig): the table's global config.
        world_size (int): ranks the table is sharded over.
        bucket_capacity (int): requested bucket width.

    Returns:
        Tuple[int, int]: ``(num_buckets, effective_bucket_width)`` per rank.

    Raises:
        ValueError: a bad ``world_size``, ``num_embeddings`` or
            ``bucket_capacity`` (not a multiple of 16 nor the sentinel).
    """
    num_embeddings = _num_embeddings(embedding_config)
    if not _is_int(world_size) or world_size <= 0:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    _check_bucket_capacity(bucket_capacity, "bucket_capacity")
    rows_per_rank = _ceil_div(num_embeddings, world_size)
    if bucket_capacity == MAX_BUCKET_CAPACITY:
        return 1, align_to_table_size(rows_per_rank, BUCKET_ALIGNMENT)
    rows = align_to_table_size(rows_per_rank, bucket_capacity)
    return rows // bucket_capacity, bucket_capacity


def get_sharded_table_capacity(
    embedding_config: Any,
    world_size: int,
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY,
) -> int:
    """Per-rank row capacity of a row-wise sharded dynamic table.

    ``num_buckets * effective_bucket_width`` of the layout the planner uses,
    i.e. the ``max_capacity`` it sets. For ``bucket_capacity=128``,
    ``num_embeddings=1000`` and ``world_size=3``: ``ceil(1000 / 3) = 334``
    rows, rounded up to whole buckets: 384. With ``MAX_BUCKET_CAPACITY``: one
    bucket of 334 rounded up to a multiple of 16: 336.

    Args:
        embedding_config (BaseEmbeddingConfig): the table's global config
            (``num_embeddings``).
        world_size (int): ranks the table is sharded over.
        bucket_capacity (int): a multiple of ``BUCKET_ALIGNMENT``, or
            ``MAX_BUCKET_CAPACITY``. Defaults to 128.

    Returns:
        int: rows per rank.

    Raises:
        ValueError: ``bucket_capacity`` is not a multiple of 16 nor
            ``MAX_BUCKET_CAPACITY``, or a bad ``world_size`` /
            ``num_embeddings``.
    """
    num_buckets, width = _sharded_table_bucket_layout(embedding_config, world_size, bucket_capacity)
    return num_buckets * width


# The optimizers dynamicemb's rows implement: the member name of the enum that
# names them (FBGEMM's EmbOptimType or DynamicEmbOptimType) -> the fused row
# update it runs (cc/embedding/optimizer.h OptimType, by name).
_EMB_OPTIM_NATIVE = {
    "SGD": "SGD",
    "EXACT_SGD": "SGD",
    "ADAM": "ADAM",
    "EXACT_ADAGRAD": "EXACT_ADAGRAD",
    "EXACT_ROWWISE_ADAGRAD": "EXACT_ROWWISE_ADAGRAD",
    # A member of FBGEMM releases newer than some dynamicemb runs with.
    "ROWWISE_RMSPROP_AR": "ROWWISE_RMSPROP_AR",
}
_DYNAMICEMB_OPTIM_NATIVE = {
    "FTRL": "FTRL",
    "ROWWISE_RMSPROP_AR": "ROWWISE_RMSPROP_AR",
}


def implemented_optimizers() -> str:
    """The optimizers dynamicemb tables implement, as an error message names them."""
    emb = ", ".join(f"EmbOptimType.{n}" for n in _EMB_OPTIM_NATIVE)
    own = ", ".join(f"DynamicEmbOptimType.{m.name}" for m in DynamicEmbOptimType)
    return f"{emb} (the last where FBGEMM has it), {own}"


def native_optimizer(optimizer_type: Any) -> str:
    """The fused row update (the native ``OptimType`` name) an optimizer runs.

    Args:
        optimizer_type (Union[EmbOptimType, DynamicEmbOptimType]): the
            ``optimizer`` of ``fused_params``.

    Raises:
        ValueError: an optimizer dynamicemb does not implement, naming the
            ones it does.
    """
    name = getattr(optimizer_type, "name", None)
    if isinstance(optimizer_type, DynamicEmbOptimType):
        return _DYNAMICEMB_OPTIM_NATIVE[name]
    if _is_emb_optim_type(optimizer_type) and name in _EMB_OPTIM_NATIVE:
        return _EMB_OPTIM_NATIVE[name]
    raise ValueError(
        f"optimizer {optimizer_type!r} is not implemented by dynamicemb tables; they "
        f"implement {implemented_optimizers()}"
    )


def optimizer_state_dim(optimizer_type: Any, dim: int, dtype: torch.dtype) -> int:
    """Optimizer-state elements stored after the embedding in one row.

    The single rule for the row layout's state width, in elements of
    ``dtype`` (rows keep it in ``OPTIMIZER_STATE_DTYPE``, float32; see
    ``value_row_bytes``):

    ========================================  =============================
    optimizer                                 state width
    ========================================  =============================
    EmbOptimType.SGD, EXACT_SGD               0
    EmbOptimType.ADAM                         ``2 * dim`` (m, then v)
    EmbOptimType.EXACT_ADAGRAD                ``dim``
    EmbOptimType.EXACT_ROWWISE_ADAGRAD        16 bytes: ``16 // itemsize``
                                              (one scalar used)
    DynamicEmbOptimType.FTRL                  ``2 * dim`` (linear, accum)
    DynamicEmbOptimType.ROWWISE_RMSPROP_AR    16 bytes: ``16 // itemsize``
    (EmbOptimType's too)                      (three scalars used)
    ========================================  =============================

    Args:
        optimizer_type (Union[EmbOptimType, DynamicEmbOptimType]): the
            ``optimizer`` of ``fused_params``.
        dim (int): embedding width.
        dtype (torch.dtype): element dtype of the row.

    Returns:
        int: state elements per row.

    Raises:
        ValueError: an optimizer dynamicemb does not implement (the message
            names those it does), or a bad ``dim`` / ``dtype``.
    """
    if not _is_int(dim) or dim <= 0:
        raise ValueError(f"optimizer_state_dim: dim must be a positive int, got {dim!r}")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"optimizer_state_dim: dtype must be a torch.dtype, got {dtype!r}")
    native = native_optimizer(optimizer_type)
    if native in ("ADAM", "FTRL"):
        return 2 * dim
    if native == "EXACT_ADAGRAD":
        return dim
    if native in ("EXACT_ROWWISE_ADAGRAD", "ROWWISE_RMSPROP_AR"):
        return _ROWWISE_STATE_BYTES // dtype.itemsize
    return 0


# Optimizer-state elements a row-wise optimizer fills of the ones it reserves.
_ROWWISE_STATE_USED = {"EXACT_ROWWISE_ADAGRAD": 1, "ROWWISE_RMSPROP_AR": 3}


def saved_state_dim(optimizer_name: str | None, state_dim: int) -> int:
    """Optimizer-state elements of a row as checkpoint files and deltas
    carry it (``TableRows.state_dim``): the row's ``state_dim`` (see
    ``optimizer_state_dim``), except a row-wise optimizer's, whose reserved
    16 bytes hold fewer scalars: those (rowwise Adagrad's one, RMSprop AR's
    three).

    Args:
        optimizer_name (Optional[str]): the optimizer's member name
            (``EXACT_ROWWISE_ADAGRAD``, ...); None for rows without state.
        state_dim (int): the row's state elements (0: none).
    """
    if state_dim and optimizer_name in _ROWWISE_STATE_USED:
        return _ROWWISE_STATE_USED[optimizer_name]
    return state_dim


def embedding_row_bytes(dim: int, embedding_dtype: torch.dtype, what: str = "embedding") -> int:
    """Bytes of the embedding part of a row (and of a checkpoint's value row):
    ``dim`` elements of ``embedding_dtype`` padded to a multiple of 4 bytes;
    for a scaled dtype (FP8) the row's float32 scale after them. For dim 3:
    12 bytes in float32, 8 in float16, 4 + 4 in FP8.

    Raises:
        ValueError: an ``embedding_dtype`` not in ``EMBEDDING_DTYPES`` (named
            with ``what``).
    """
    if embedding_dtype not in EMBEDDING_DTYPES:
        raise ValueError(
            f"{what}: embedding_dtype must be one of {EMBEDDING_DTYPES}, got {embedding_dtype!r}"
        )
    padded = _ceil_div(dim * embedding_dtype.itemsize, _ROW_ALIGNMENT) * _ROW_ALIGNMENT
    return padded + (4 if embedding_dtype in SCALED_DTYPES else 0)


def value_row_bytes(
    optimizer_type: Any,
    dim: int,
    embedding_dtype: torch.dtype,
    training: bool = True,
) -> int:
    """Bytes of one value row of a table.

    The single rule for the row layout: the embedding
    (``embedding_row_bytes``: ``dim`` elements of ``embedding_dtype`` padded
    to a multiple of 4 bytes, and for FP8 the row's float32 scale), then (in
    training)
    ``optimizer_state_dim(optimizer_type, dim, OPTIMIZER_STATE_DTYPE)``
    float32 elements of optimizer state. For dim 3 in float16 with Adam:
    6 bytes padded to 8, plus 6 floats, 32 bytes.

    Args:
        optimizer_type (Optional[Union[EmbOptimType, DynamicEmbOptimType]]):
            the optimizer whose state the rows carry; None means no state (plain
            SGD).
        dim (int): embedding width.
        embedding_dtype (torch.dtype): one of ``EMBEDDING_DTYPES``.
        training (bool): False: rows carry no optimizer state.

    Returns:
        int: bytes per row, a multiple of 4.

    Raises:
        ValueError: a bad ``dim`` or ``embedding_dtype``, or an optimizer
            without a dynamicemb row layout.
    """
    if not _is_int(dim) or dim <= 0:
        raise ValueError(f"value_row_bytes: dim must be a positive int, got {dim!r}")
    embedding = embedding_row_bytes(dim, embedding_dtype, "value_row_bytes")
    if not training or optimizer_type is None:
        return embedding
    state = optimizer_state_dim(optimizer_type, dim, OPTIMIZER_STATE_DTYPE)
    return embedding + state * OPTIMIZER_STATE_DTYPE.itemsize


def get_table_value_bytes(
    embedding_config: Any,
    optimizer_type: Any,
    world_size: int,
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY,
) -> int:
    """Bytes of the value rows of a sharded dynamic table over all ranks.

    ``get_sharded_table_capacity(...) * value_row_bytes(...) * world_size``,
    with ``dim`` and the embedding dtype taken from ``embedding_config``
    (``embedding_dim``, ``data_type``): exactly what the ranks allocate for the
    rows of a table that dtype at ``max_capacity``. Use it to size
    ``global_hbm_for_values``, scaled by a cache ratio as you see fit.

    Args:
        embedding_config (BaseEmbeddingConfig): the table's global config.
        optimizer_type (Union[EmbOptimType, DynamicEmbOptimType]): the
            optimizer whose state the rows carry.
        world_size (int): ranks the table is sharded over.
        bucket_capacity (int): as for ``get_sharded_table_capacity``.

    Returns:
        int: total bytes.

    Raises:
        ValueError: as ``get_sharded_table_capacity`` and
            ``value_row_bytes``, or a ``data_type`` that is not float32,
            float16 or bfloat16.
    """
    rows = get_sharded_table_capacity(embedding_config, world_size, bucket_capacity)
    dim = getattr(embedding_config, "embedding_dim", None)
    dtype = embedding_config_dtype(embedding_config)
    return rows * value_row_bytes(optimizer_type, dim, dtype) * world_size


def _normalize_score_strategy(value: Any) -> ScoreStrategy:
    """Validate a score strategy; ``(X,)`` becomes ``X``.

    Raises:
        ValueError: not a strategy, or an unsupported compound.
    """
    if isinstance(value, (tuple, list)):
        members = tuple(_to_enum(DynamicEmbScoreStrategy, item, "score_strategy") for item in value)
        if len(members) == 1:
            return members[0]
        if len(members) == 2 and frozenset(members) == _COMPOUND_SCORE_STRATEGY:
            return members
        raise ValueError(
            "DynamicEmbTableOptions.score_strategy: the only supported compound is "
            f"(TIMESTAMP, LFU) in either order, got {value!r}"
        )
    return _to_enum(DynamicEmbScoreStrategy, value, "score_strategy")


def _check_bucket_capacity(bucket_capacity: Any, what: str) -> None:
    """Raise ValueError unless a multiple of 16 or MAX_BUCKET_CAPACITY."""
    if (
        not _is_int(bucket_capacity)
        or bucket_capacity <= 0
        or (bucket_capacity != MAX_BUCKET_CAPACITY and bucket_capacity % BUCKET_ALIGNMENT != 0)
    ):
        raise ValueError(
            f"{what} must be a positive multiple of BUCKET_ALIGNMENT ({BUCKET_ALIGNMENT}) "
            f"or MAX_BUCKET_CAPACITY (2**63 - 1), got {bucket_capacity!r}"
        )


def _num_embeddings(embedding_config: Any) -> int:
    num_embeddings = getattr(embedding_config, "num_embeddings", None)
    if not _is_int(num_embeddings) or num_embeddings <= 0:
        raise ValueError(
            f"embedding_config.num_embeddings must be a positive int, got {num_embeddings!r}"
        )
    return num_embeddings


def embedding_config_dtype(embedding_config: Any) -> torch.dtype:
    """The value dtype of a TorchRec embedding config (its ``data_type``)."""
    data_type = getattr(embedding_config, "data_type", None)
    if isinstance(data_type, torch.dtype):
        dtype = data_type
    elif data_type is None:
        dtype = torch.float32
    else:
        from torchrec.modules.embedding_configs import data_type_to_dtype

        dtype = data_type_to_dtype(data_type)
    if dtype not in EMBEDDING_DTYPES:
        raise ValueError(
            f"embedding_config.data_type must be one of {EMBEDDING_DTYPES}, got {data_type!r}"
        )
    return dtype


def _is_emb_optim_type(value: Any) -> bool:
    """True for a member of FBGEMM's EmbOptimType (imported only if needed)."""
    if not isinstance(value, enum.Enum):
        return False
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
    except ImportError:
        return False
    return isinstance(value, EmbOptimType)


def _to_enum(enum_type: type[enum.Enum], value: Any, name: str) -> Any:
    """``enum_type(value)``, with an error naming the field and the value."""
    if isinstance(value, enum_type):
        return value
    if isinstance(value, enum.Enum) or isinstance(value, bool):
        # A member of another enum (or a bool) is never silently converted.
        raise ValueError(f"{name} must be a {enum_type.__name__}, got {value!r}")
    try:
        return enum_type(value)
    except ValueError:
        raise ValueError(f"{name} must be a {enum_type.__name__}, got {value!r}") from None


def _is_integer_dtype(dtype: Any) -> bool:
    return (
        isinstance(dtype, torch.dtype)
        and not dtype.is_floating_point
        and not dtype.is_complex
        and dtype != torch.bool
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)

"""Per-rank options of a dynamic table, and what one rank of it stores.

``prepare_table_options`` is the preparation step of the spec's "Sharding
planner" section (the spec's internal ``_prepare_dynemb_table_options``), the
one the planner and the sharders both run; ``dynamic_shard_storage`` is the
per-rank memory a dynamic table allocates, which the topology's budget does
not include (the enumerator works it out to refuse options a table cannot be
built from, and counts only the lookups' buffers against the topology).
"""

import dataclasses
import logging
import warnings
from typing import Any

import torch
import torch.distributed as dist

from .._checks import is_int
from .._warnings import warn_once
from ..dynamicemb_config import (
    DynamicEmbTableOptions,
    _num_embeddings,
    _sharded_table_bucket_layout,
    align_to_table_size,
    complete_initializer_args,
    embedding_config_dtype,
)

log = logging.getLogger("dynamicemb.planner")

# A table that whole buckets make larger than asked by more than this fraction
# of its num_embeddings is told with a warning; a smaller rounding (a large
# table's last partial bucket) is logged at INFO only.
ROUNDING_WARN_FRACTION = 0.01

__all__ = [
    "DynamicShardStorage",
    "_prepare_dynemb_table_options",
    "dynamic_shard_storage",
    "prepare_table_options",
]


def prepare_table_options(
    options: DynamicEmbTableOptions,
    embedding_config: Any,
    world_size: int,
) -> DynamicEmbTableOptions:
    """The options one rank of a row-wise sharded dynamic table uses.

    The planner prepares every dynamic table's options with it, and the
    sharders prepare each table's options of the plan again when they build
    its module (preparing is idempotent, so a plan from the planner is left
    as it is, and a plan written by hand gets the same options).

    The spec's preparation, in its order, on a copy (``options`` is not
    modified; objects it refers to, like an admission strategy, are shared):

    0. ``dim`` = the table's columns: ``local_cols`` of a sharded table
       (what the embedding kernel is built from), else
       ``embedding_config.embedding_dim``. A ``dim`` already set that differs
       is replaced, with a warning naming the table and both values (the
       spec's "the embedding kernel only warns"): the columns are what
       TorchRec lays the lookup's output and the checkpoint's rows out by;
    1. ``initializer_args`` = ``complete_initializer_args(initializer_args,
       embedding_config)``;
    2. ``(num_buckets, width) = _sharded_table_bucket_layout(embedding_config,
       world_size, bucket_capacity)``; ``bucket_capacity`` = width,
       ``max_capacity`` = ``num_buckets * width``; ``init_capacity``: None
       becomes ``max_capacity``, a value is rounded up to whole buckets and
       then clamped to ``max_capacity``;
    3. ``local_hbm_for_values`` = ``ceil(global_hbm_for_values / world_size)``
       when a global budget is given; a per-rank budget given alone (global
       0, as in a plan written by hand) is kept;
    4. (not a step of the spec's) ``embedding_dtype``: None becomes the
       config's ``data_type`` (``embedding_config_dtype``).

    Preparing prepared options again for the same config and world size
    gives the same options.

    Args:
        options (DynamicEmbTableOptions): the table's options as the user
            gave them.
        embedding_config (BaseEmbeddingConfig): the table's global TorchRec
            config (``num_embeddings``, ``embedding_dim``), or TorchRec's
            ``ShardedEmbeddingTable`` of the table (``local_cols`` too).
        world_size (int): ranks the table is sharded over.

    Returns:
        DynamicEmbTableOptions: a new object with the per-rank values.

    Raises:
        TypeError: ``options`` is not a DynamicEmbTableOptions.
        ValueError: a bad ``bucket_capacity``, ``world_size``,
            ``num_embeddings`` or ``embedding_dim`` (the message names the
            table and the value).

    Warns:
        UserWarning: ``options.dim`` is set and differs from the columns; or
            whole buckets make the table more than ``ROUNDING_WARN_FRACTION``
            larger than its ``num_embeddings`` (once per table and process,
            on rank 0: ``say_rounded``).
    """
    table = getattr(embedding_config, "name", None)
    if not isinstance(options, DynamicEmbTableOptions):
        raise TypeError(
            f"table {table!r}: dynamicemb_options must be a DynamicEmbTableOptions, got {options!r}"
        )
    field = "local_cols" if getattr(embedding_config, "local_cols", 0) else "embedding_dim"
    dim = getattr(embedding_config, field, None)
    if not is_int(dim) or dim <= 0:
        raise ValueError(
            f"table {table!r}: embedding_config.{field} must be a positive int, got {dim!r}"
        )
    if options.dim is not None and options.dim != dim:
        warnings.warn(
            f"table {table!r}: dynamicemb_options.dim ({options.dim}) differs from the "
            f"table's {field} ({dim}); the table is built with dim {dim}",
            stacklevel=2,
        )
    initializer_args = complete_initializer_args(options.initializer_args, embedding_config)
    num_buckets, width = _sharded_table_bucket_layout(
        embedding_config, world_size, options.bucket_capacity
    )
    max_capacity = num_buckets * width
    say_rounded(table, _num_embeddings(embedding_config), world_size, max_capacity, width)
    if options.init_capacity is None:
        init_capacity = max_capacity
    else:
        init_capacity = min(align_to_table_size(options.init_capacity, width), max_capacity)
    return dataclasses.replace(
        options,
        dim=dim,
        initializer_args=initializer_args,
        bucket_capacity=width,
        max_capacity=max_capacity,
        init_capacity=init_capacity,
        local_hbm_for_values=(
            -(-options.global_hbm_for_values // world_size)
            if options.global_hbm_for_values
            else options.local_hbm_for_values
        ),
        embedding_dtype=options.embedding_dtype or embedding_config_dtype(embedding_config),
    )


def say_rounded(table, asked: int, world_size: int, per_rank: int, width: int) -> None:
    """Says, once per table and process (on rank 0 of a process group), that
    the table holds more rows than its ``num_embeddings`` asked for: its
    rows per rank are whole buckets of ``width`` slots. A warning when it
    grows by more than ``ROUNDING_WARN_FRACTION``, else an INFO log line of
    ``dynamicemb.planner``."""
    got = per_rank * world_size
    if got == asked or (dist.is_initialized() and dist.get_rank() != 0):
        return
    message = (
        f"dynamic table {table!r}: num_embeddings={asked} gives {got} rows ({per_rank} per rank "
        f"on {world_size} rank{'' if world_size == 1 else 's'}: whole hash buckets of "
        f"bucket_capacity={width} slots). Set "
        f"num_embeddings={got} to ask for what the table holds, or a smaller bucket_capacity "
        "(a multiple of 16) for a finer size."
    )
    if got - asked > ROUNDING_WARN_FRACTION * asked:
        warn_once(f"rounded:{table}:{asked}:{world_size}:{got}", message, stacklevel=4)
    elif (table, asked, world_size, got) not in _logged:
        _logged.add((table, asked, world_size, got))
        log.info(message)


_logged: set[tuple] = set()


# The name the spec gives the planner's preparation step.
_prepare_dynemb_table_options = prepare_table_options


@dataclasses.dataclass(frozen=True)
class DynamicShardStorage:
    """Bytes one rank of a dynamic table allocates when it is built.

    Attributes:
        hbm (int): device memory: the values kept on the device plus every
            hash table's metadata (keys, digests, scores, table info,
            counters, free rows).
        ddr (int): host memory: the values not kept on the device.
    """

    hbm: int
    ddr: int


def dynamic_shard_storage(
    options: DynamicEmbTableOptions,
    dtype: torch.dtype,
    optimizer: Any | None,
    compute_device: str,
) -> DynamicShardStorage:
    """Memory of one rank of a dynamic table, from its prepared options: what
    its storage allocates when it is built (``dynamicemb.storage.plan_footprint``,
    the rules ``create_storage`` allocates by).

    The table is built with ``init_capacity`` rows (and grows toward
    ``max_capacity`` as keys arrive, which is not reserved here). A row is
    ``value_row_bytes`` of ``embedding_dtype`` (or ``dtype``) with the
    optimizer's state in training.

    * ``caching=False`` (hybrid table): ``local_hbm_for_values // row_bytes``
      rows (at most all) on the device, the rest on the host;
    * ``caching=True``: a device cache of ``local_hbm_for_values // row_bytes``
      slots (in buckets of 1024), with its own metadata, in front of a host
      table of ``init_capacity`` rows whose metadata is on the device;
    * an external storage: its own memory is not counted.

    The admission strategy's state (``AdmissionStrategy.state_bytes``: a
    frequency counter's share) is device memory too. On a compute device
    without HBM (``"cpu"``) everything is host memory.

    Args:
        options (DynamicEmbTableOptions): prepared options (``dim`` and
            ``init_capacity`` set).
        dtype (torch.dtype): the table's dtype when ``embedding_dtype`` is None.
        optimizer (Optional[Union[EmbOptimType, DynamicEmbOptimType]]): the
            sharder's fused optimizer; None means plain SGD (no state).
        compute_device (str): the topology's compute device.

    Returns:
        DynamicShardStorage: bytes on the device and on the host.

    Raises:
        ValueError: the options are not prepared, the optimizer has no
            dynamicemb row layout, or a cache budget holds fewer than 16 rows.
    """
    from dynamicemb.storage import plan_footprint

    if options.dim is None or options.init_capacity is None:
        raise ValueError(
            "dynamic_shard_storage needs prepared options (dim and init_capacity set), "
            f"got dim={options.dim!r}, init_capacity={options.init_capacity!r}"
        )
    f = plan_footprint(options, dtype, optimizer)
    device = f.device
    if options.admit_strategy is not None:
        device += options.admit_strategy.state_bytes()
    if compute_device not in ("cuda", "mtia"):
        return DynamicShardStorage(hbm=0, ddr=device + f.host)
    return DynamicShardStorage(hbm=device, ddr=f.host)


# Attribute names under which prepared options remember what they were
# prepared from, and what they looked like then.
_REQUEST_ATTR = "_dynamicemb_request"
_SNAPSHOT_ATTR = "_dynamicemb_prepared_snapshot"


def _record_request(prepared: DynamicEmbTableOptions, request: DynamicEmbTableOptions) -> None:
    """Remembers on ``prepared`` the ``request`` it was prepared from (a
    ``_requested_options``), and what ``prepared`` looks like now."""
    object.__setattr__(prepared, _REQUEST_ATTR, request)
    object.__setattr__(prepared, _SNAPSHOT_ATTR, dataclasses.replace(prepared))


def _requested_options(options: DynamicEmbTableOptions | None) -> DynamicEmbTableOptions:
    """The options to prepare: the user's request behind options a planner
    prepared (while they are as it left them), else ``options`` itself."""
    if options is None:
        return DynamicEmbTableOptions()
    request = getattr(options, _REQUEST_ATTR, None)
    snapshot = getattr(options, _SNAPSHOT_ATTR, None)
    if request is not None and snapshot is not None and options == snapshot:
        return request
    return options

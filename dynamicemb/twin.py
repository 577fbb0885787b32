"""construct_twin_module: the TorchRec model a dynamic model should agree with.

A dynamic table creates a key's row on first sight from a counter-based
initializer that depends only on (seed, table id, key, element), so the rows
it would create for keys ``0 .. num_embeddings - 1`` can be written down in
advance. The twin is the same model with every dynamic table replaced by an
ordinary TorchRec table holding exactly those rows, planned row-wise with the
``FUSED`` kernel. Trained with the same optimizer on the same batches, the
two must give the same outputs and rows: a test oracle for the dynamic path.

Needs TorchRec and the C++ extension (the initializer).
"""

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .dynamicemb_config import (
    DynamicEmbOptimType,
    DynamicEmbTableOptions,
    complete_initializer_args,
)

__all__ = ["construct_twin_module", "dynamic_table_ids", "twin_rows"]

# Rows initialized per call, to bound the temporary memory of a large table.
_CHUNK_ROWS = 1 << 16


def construct_twin_module(
    model: nn.Module,
    constraints: Mapping[str, Any],
    fused_params: Mapping[str, Any] | None = None,
    table_ids: Mapping[str, int] | None = None,
    seed: int = 0,
) -> tuple[nn.Module, dict[str, Any]]:
    """Builds the TorchRec twin of a model with dynamic tables.

    Every ``EmbeddingCollection`` / ``EmbeddingBagCollection`` table whose
    constraints are ``DynamicEmbParameterConstraints(use_dynamicemb=True)``
    becomes an ordinary table of its config's ``num_embeddings`` rows, row
    ``k`` being the row the dynamic table initializes for key ``k``
    (``twin_rows``). Its constraints become a plain ``ParameterConstraints``
    with the same TorchRec fields, ``sharding_types=["row_wise"]`` and
    ``compute_kernels=["fused"]``. Other tables and constraints are kept
    (a ``DynamicEmbParameterConstraints`` of a static table becomes the
    plain ``ParameterConstraints`` it carries). ``model`` is not modified.

    A dynamic table's initializer is its options' ``initializer_args``,
    completed with its config as the planner does (UNIFORM and
    TRUNCATED_NORMAL bounds ``±sqrt(1 / num_embeddings)``); prepared options
    give the same.

    Args:
        model (nn.Module): the model, before sharding. Dynamic tables may be
            on the meta device: their twin weights are created on the CPU.
        constraints (Mapping[str, ParameterConstraints]): the model's
            per-table constraints, as given to the planner.
        fused_params (Optional[Mapping[str, Any]]): the sharders'
            ``fused_params``; only the ``optimizer`` is read, to refuse those
            without an FBGEMM counterpart.
        table_ids (Optional[Mapping[str, int]]): the table id each dynamic
            table's initializer uses. Default: ``dynamic_table_ids(model,
            constraints)``.
        seed (int): the dynamic tables' initializer seed. Defaults to 0.

    Returns:
        Tuple[nn.Module, Dict[str, ParameterConstraints]]: the twin model and
        its constraints.

    Raises:
        ValueError: the optimizer is ``DynamicEmbOptimType.FTRL`` (no FBGEMM
            counterpart); a dynamic table named in ``constraints`` is not in
            the model; ``table_ids`` lacks a dynamic table.
        TypeError: a dynamic table's options are not DynamicEmbTableOptions.
    """
    optimizer = (fused_params or {}).get("optimizer")
    if isinstance(optimizer, DynamicEmbOptimType):
        raise ValueError(
            f"construct_twin_module: optimizer {optimizer!r} has no FBGEMM counterpart, "
            "so a TorchRec twin cannot train like the dynamic model"
        )
    dynamic = {name for name, c in constraints.items() if _is_dynamic(c)}
    found = {name for name, _, _ in _tables(model)}
    missing = sorted(dynamic - found)
    if missing:
        raise ValueError(
            f"construct_twin_module: dynamic tables {missing} are not tables of the model's "
            "EmbeddingCollection / EmbeddingBagCollection modules"
        )
    if table_ids is None:
        table_ids = dynamic_table_ids(model, constraints)
    lacking = sorted(dynamic - set(table_ids))
    if lacking:
        raise ValueError(f"construct_twin_module: table_ids has no entry for {lacking}")

    rows: dict[str, torch.Tensor] = {}
    for name, config, weight in _tables(model):
        if name not in dynamic:
            continue
        options = constraints[name].dynamicemb_options or DynamicEmbTableOptions()
        if not isinstance(options, DynamicEmbTableOptions):
            raise TypeError(
                f"table {name!r}: dynamicemb_options must be DynamicEmbTableOptions, got "
                f"{options!r}"
            )
        args = complete_initializer_args(options.initializer_args, config)
        device = weight.device if weight.device.type != "meta" else torch.device("cpu")
        rows[name] = twin_rows(
            config.num_embeddings, config.embedding_dim, args, table_ids[name], seed, device
        ).to(weight.dtype)

    twin = copy.deepcopy(model)
    for name, _, weight_owner in _table_modules(twin):
        if name in rows:
            weight_owner.weight = nn.Parameter(
                rows[name], requires_grad=weight_owner.weight.requires_grad
            )
    return twin, {name: _twin_constraint(c) for name, c in constraints.items()}


def twin_rows(
    num_embeddings: int,
    dim: int,
    initializer_args: Any,
    table_id: int,
    seed: int = 0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Rows a dynamic table initializes for keys ``0 .. num_embeddings - 1``.

    Args:
        num_embeddings (int): rows.
        dim (int): row width.
        initializer_args (DynamicEmbInitializerArgs): the (completed)
            initializer.
        table_id (int): the table id the dynamic module gives the table.
        seed (int): the dynamic module's initializer seed.
        device (Optional[torch.device]): where to compute them (CPU default;
            CPU and CUDA give the same rows).

    Returns:
        torch.Tensor: (num_embeddings, dim) float32.
    """
    from .embedding.initializer import init_rows

    device = torch.device("cpu") if device is None else torch.device(device)
    out = torch.empty(num_embeddings, dim, dtype=torch.float32, device=device)
    for start in range(0, num_embeddings, _CHUNK_ROWS):
        keys = torch.arange(start, min(start + _CHUNK_ROWS, num_embeddings), device=device)
        out[start : start + keys.numel()] = init_rows(
            keys, dim, initializer_args, torch.full_like(keys, table_id), seed
        )
    return out


def dynamic_table_ids(model: nn.Module, constraints: Mapping[str, Any]) -> dict[str, int]:
    """The default table ids of the dynamic tables of a model.

    A dynamic table's id is its position among the dynamic tables of its
    ``EmbeddingCollection`` / ``EmbeddingBagCollection``, in the module's
    config order (``planner.parameter_sharding.initializer_table_ids``):
    the ids the sharders give the tables, at every world size and however
    they are fused, and those of one unsharded
    ``BatchedDynamicEmbeddingTablesV2`` built from the tables in that order.

    Args:
        model (nn.Module): the model.
        constraints (Mapping[str, ParameterConstraints]): its constraints.

    Returns:
        Dict[str, int]: table name -> id.
    """
    from .planner.parameter_sharding import initializer_table_ids

    ids: dict[str, int] = {}
    for _, module in _collections(model):
        names = [config.name for config in _configs(module)]
        ids.update(
            initializer_table_ids(names, {n for n in names if _is_dynamic(constraints.get(n))})
        )
    return ids


def _is_dynamic(constraint: Any) -> bool:
    from .planner.enumerator import is_dynamic_table

    return is_dynamic_table(constraint)


def _twin_constraint(constraint: Any) -> Any:
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType

    if not isinstance(constraint, ParameterConstraints):
        return constraint
    plain = ParameterConstraints(
        **{
            f.name: copy.copy(getattr(constraint, f.name))
            for f in dataclasses.fields(ParameterConstraints)
            if f.init
        }
    )
    if _is_dynamic(constraint):
        plain.sharding_types = [ShardingType.ROW_WISE.value]
        plain.compute_kernels = [EmbeddingComputeKernel.FUSED.value]
    return plain


def _collections(model: nn.Module):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    for path, module in model.named_modules():
        if isinstance(module, (EmbeddingCollection, EmbeddingBagCollection)):
            yield path, module


def _configs(module: nn.Module):
    from torchrec.modules.embedding_modules import EmbeddingCollection

    if isinstance(module, EmbeddingCollection):
        return module.embedding_configs()
    return module.embedding_bag_configs()


def _table_modules(model: nn.Module):
    """(table name, config, nn.Embedding / nn.EmbeddingBag) of every table."""
    from torchrec.modules.embedding_modules import EmbeddingCollection

    for _, module in _collections(model):
        tables = (
            module.embeddings if isinstance(module, EmbeddingCollection) else module.embedding_bags
        )
        for config in _configs(module):
            yield config.name, config, tables[config.name]


def _tables(model: nn.Module):
    """(table name, config, weight) of every table."""
    for name, config, table in _table_modules(model):
        yield name, config, table.weight

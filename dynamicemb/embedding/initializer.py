"""Initial embedding rows from a counter-based generator (cc/embedding/initializer.h).

A row depends only on (seed, table id, key, element index): the same key gets
the same initial row on the CPU and the GPU, whatever batch it arrives in and
in whatever order.
"""

import torch

from dynamicemb.dynamicemb_config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    complete_initializer_args,
)
from dynamicemb.table._native import constants, ops


def init_rows(
    keys: torch.Tensor,
    dim: int,
    args: DynamicEmbInitializerArgs,
    table_ids: torch.Tensor | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Initial rows of ``keys``.

    Args:
        keys (torch.Tensor): (n) int64.
        dim (int): row width.
        args (DynamicEmbInitializerArgs): the initializer; UNIFORM bounds left
            as None become 0.0 and 1.0 (``complete_initializer_args`` without a
            table config). TRUNCATED_NORMAL samples ``mean + std_dev * N(0, 1)``
            restricted to ``[lower, upper]`` (default +-2 std_dev around the
            mean). DEBUG gives every element ``key mod DEBUG_MODULUS``.
        table_ids (torch.Tensor, optional): (n) int64, part of the generator's
            key, so the same key differs between tables; zeros by default.
        seed (int): the generator's seed.

    Returns:
        torch.Tensor: (n, dim) float32 on the keys' device.

    Example::

        rows = init_rows(torch.tensor([7, 8]), 4, DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.01))
    """
    if table_ids is None:
        table_ids = torch.zeros_like(keys)
    return ops().init_rows(keys, table_ids, int(dim), *initializer_op_args(args), int(seed))


def initializer_op_args(
    args: DynamicEmbInitializerArgs,
) -> tuple[int, float, float, float, float, float]:
    """The ops' ``(mode, mean, std_dev, lower, upper, value)`` of an initializer."""
    if not isinstance(args, DynamicEmbInitializerArgs):
        raise TypeError(f"args must be DynamicEmbInitializerArgs, got {type(args).__name__}")
    args = complete_initializer_args(args)
    lower, upper = args.lower, args.upper
    if args.mode == DynamicEmbInitializerMode.TRUNCATED_NORMAL:
        lower = args.mean - 2.0 * args.std_dev if lower is None else lower
        upper = args.mean + 2.0 * args.std_dev if upper is None else upper
    lower = 0.0 if lower is None else float(lower)
    upper = 1.0 if upper is None else float(upper)
    mode = int(constants()["InitMode"][args.mode.name])
    return mode, float(args.mean), float(args.std_dev), lower, upper, float(args.value)


def init_rows_at(
    space: tuple[torch.Tensor, torch.Tensor],
    offsets: torch.Tensor,
    keys: torch.Tensor,
    table_ids: torch.Tensor,
    dim: int,
    op_args: tuple[int, float, float, float, float, float],
    seed: int,
    element_type: int,
    state_dim: int,
    state_fill: tuple[int, float] = (0, 0.0),
) -> None:
    """Writes ``init_rows``' rows straight into a row space: the row at
    ``offsets[i]`` (skipped where -1) gets the embedding of ``keys[i]`` in
    table ``table_ids[i]`` (the initializer's ``initializer_op_args``) at the
    native ``element_type``, then ``state_dim``
    float32 of optimizer state, zeros from index 0 and ``state_fill[1]`` from
    index ``state_fill[0]`` on. One kernel whatever the number of new keys, so
    a batch's new rows are written without reading that number."""
    fill_from, fill = state_fill
    ops().init_rows_at(
        space[0],
        space[1],
        offsets,
        keys,
        table_ids,
        int(dim),
        *op_args,
        int(seed),
        int(element_type),
        int(state_dim),
        int(fill_from),
        float(fill),
    )

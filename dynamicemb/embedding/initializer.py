"""Initial embedding rows from a counter-based generator (cc/embedding/initializer.h).

A row depends only on (seed, table id, key, element index): the same key gets
the same initial row on the CPU and the GPU, whatever batch it arrives in and
in whatever order. ``MultiTableInitializer`` applies each table's own
arguments to the keys of several fused tables.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dynamicemb._checks import device_of
from dynamicemb.dynamicemb_config import (
    DynamicEmbInitializerArgs,
    complete_initializer_args,
)
from dynamicemb.table import constants, ops


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
        args (DynamicEmbInitializerArgs): the initializer; bounds left as
            None are completed without a table config
            (``complete_initializer_args``: 0.0 and 1.0 for UNIFORM, +-2
            std_dev around the mean for TRUNCATED_NORMAL). TRUNCATED_NORMAL
            samples ``mean + std_dev * N(0, 1)`` restricted to ``[lower,
            upper]``. DEBUG gives every element ``key mod DEBUG_MODULUS``.
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


@dataclass
class InitGroup:
    """Tables sharing dim and initializer arguments (one init_rows or
    init_rows_at call): their dim, initializer arguments (and the ops' form of
    them, initializer_op_args), the tables (a list, and on the device)."""

    dim: int
    args: DynamicEmbInitializerArgs
    op_args: tuple
    table_list: list[int]
    tables: torch.Tensor


class MultiTableInitializer:
    """Initial rows for the keys of several fused tables, each table by its own
    arguments.

    What a module calls to write new rows (training), the rows of keys it
    misses (eval) and the rows of keys its admitter rejects
    (``MultiTableAdmitter.non_admitted_initializer``). Tables that share a
    width and arguments are served by one ``init_rows`` call.

    Args:
        table_args (Sequence[DynamicEmbInitializerArgs]): one per table, in
            the module's table order.

    Raises:
        TypeError: an entry is not a DynamicEmbInitializerArgs (named with its
            index).
        ValueError: ``table_args`` is empty.

    Example::

        init = MultiTableInitializer([DynamicEmbInitializerArgs(), const_args])
        rows = init(keys, table_ids, dims=[8, 4])   # (n, 8); table 1 rows use 4 columns
    """

    def __init__(self, table_args: Sequence[DynamicEmbInitializerArgs]) -> None:
        table_args = list(table_args)
        if not table_args:
            raise ValueError("MultiTableInitializer needs the arguments of at least one table")
        for t, args in enumerate(table_args):
            if not isinstance(args, DynamicEmbInitializerArgs):
                raise TypeError(
                    f"MultiTableInitializer: table {t}'s arguments must be a "
                    f"DynamicEmbInitializerArgs, got {args!r}"
                )
        self.table_args = table_args
        self._groups: dict = {}

    @property
    def num_tables(self) -> int:
        return len(self.table_args)

    def groups(self, dims: Sequence[int], device: torch.device) -> list["InitGroup"]:
        """The tables sharing (dim, arguments), one InitGroup each (built once
        per dims and device)."""
        # One key for torch.device("cuda") and the keys' cuda:N: the groups
        # built with the module's device serve the step's lookups.
        key = (tuple(int(d) for d in dims), device_of(device))
        if key not in self._groups:
            if len(key[0]) != self.num_tables:
                raise ValueError(
                    f"MultiTableInitializer has {self.num_tables} tables, got {len(key[0])} dims"
                )
            groups: dict = {}
            for t, (d, args) in enumerate(zip(key[0], self.table_args)):
                groups.setdefault((d, repr(args)), (d, args, []))[2].append(t)
            self._groups[key] = [
                InitGroup(
                    d,
                    args,
                    initializer_op_args(args),
                    ts,
                    torch.tensor(ts, dtype=torch.int64, device=device),
                )
                for d, args, ts in groups.values()
            ]
        return self._groups[key]

    def write_at(
        self,
        space: tuple[torch.Tensor, torch.Tensor],
        offsets: torch.Tensor,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        dims: Sequence[int],
        generator_table_ids: torch.Tensor | None,
        seed: int,
        element_type: int,
        state: Callable[["InitGroup"], tuple[int, tuple[int, float]]] | None = None,
    ) -> None:
        """Writes the initial rows of ``keys`` into a row space at byte
        ``offsets`` (-1: skipped), one ``init_rows_at`` per group over every
        entry (those of other groups at -1): no selection, no
        synchronization.

        Args:
            space: the row space's two segments.
            offsets (torch.Tensor): (n) int64 byte offsets, -1 to skip.
            keys, table_ids, dims, generator_table_ids, seed: as for
                ``__call__``.
            element_type (int): the rows' native ElementType.
            state (Optional[Callable]): a group's optimizer-state width and
                fill (``init_rows_at``'s ``state_dim``, ``state_fill``);
                None: rows without state.
        """
        init_ids = _generator_ids(table_ids, generator_table_ids)
        groups = self.groups(dims, keys.device)
        for g in groups:
            sdim, fill = (0, (0, 0.0)) if state is None else state(g)
            at = offsets
            if len(groups) > 1:
                at = torch.where(torch.isin(table_ids, g.tables), offsets, -1)
            init_rows_at(
                space, at, keys, init_ids, g.dim, g.op_args, seed, element_type, sdim, fill
            )

    def __call__(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        dims: Sequence[int],
        generator_table_ids: torch.Tensor | None = None,
        seed: int = 0,
    ) -> torch.Tensor:
        """Initial rows of ``keys``, as (n, max(dims)) float32: row i has its
        table's width of values, zeros after them; one ``init_rows`` per group.

        Args:
            keys (torch.Tensor): (n) int64.
            table_ids (torch.Tensor): (n) int64, each key's table.
            dims (Sequence[int]): the width of each table.
            generator_table_ids (Optional[torch.Tensor]): (num_tables) int64,
                the table id each table's rows are generated with (see
                ``init_rows``); default: its own.
            seed (int): the generator's seed.
        """
        out = torch.zeros(keys.numel(), max(int(d) for d in dims), device=keys.device)
        init_ids = _generator_ids(table_ids, generator_table_ids)
        groups = self.groups(dims, keys.device)
        for g in groups:
            if len(groups) == 1:
                out[:, : g.dim] = init_rows(keys, g.dim, g.args, init_ids, seed)
                continue
            sel = torch.isin(table_ids, g.tables)
            out[sel, : g.dim] = init_rows(keys[sel], g.dim, g.args, init_ids[sel], seed)
        return out


def _generator_ids(table_ids: torch.Tensor, generator_table_ids: torch.Tensor | None):
    """The table id each key's rows are generated with: its table's entry of
    ``generator_table_ids``, or its table id itself where that is None."""
    return table_ids if generator_table_ids is None else generator_table_ids[table_ids]

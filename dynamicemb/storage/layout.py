"""The row format of a fused module's tables.

A row of table t is ``dims[t]`` embedding elements of ``dtype``, padded to 4
bytes (for FP8, then the row's float32 scale: ``dynamicemb.io.embeddings``),
then ``state_dims[t]`` float32 elements of optimizer state: the rule of
``dynamicemb_config.value_row_bytes`` (and of ``cc/storage/row_space.h`` on
the native side). Fused tables keep their own widths.
"""

from collections.abc import Sequence
from typing import Any

import torch

from dynamicemb.dynamicemb_config import (
    EMBEDDING_DTYPES,
    OPTIMIZER_STATE_DTYPE,
    embedding_row_bytes,
    optimizer_state_dim,
    value_row_bytes,
)
from dynamicemb.io import embeddings as emb
from dynamicemb.table import constants

# torch dtype -> the native ElementType name (FLOAT32, ..., FLOAT8_E4M3FN), for
# the embedding dtypes the configuration allows.
_ELEMENT_TYPES = {d: str(d).removeprefix("torch.").upper() for d in EMBEDDING_DTYPES}


class RowLayout:
    """Row format of the tables of one module.

    Args:
        dims (Sequence[int]): embedding width of each table.
        dtype (torch.dtype): the embeddings' dtype (one of
            ``EMBEDDING_DTYPES``).
        optimizer: the optimizer type whose state the rows carry (None: none).
        training (bool): False: rows carry no optimizer state.

    Attributes:
        dims (List[int]), state_dims (List[int]): per table, in elements.
        row_bytes (List[int]): bytes of one row of each table.
        embedding_bytes (List[int]): bytes of its embedding part (the
            padded elements, and an FP8 row's scale).
        state_offsets (List[int]): byte offset of the state in a row.
        max_row_bytes (int): the widest row.
        element_type (int): the native ElementType of ``dtype``.
        scaled (bool): whether rows carry a scale (FP8), written with
            stochastic rounding.
    """

    def __init__(
        self, dims: Sequence[int], dtype: torch.dtype, optimizer: Any, training: bool
    ) -> None:
        if dtype not in _ELEMENT_TYPES:
            raise ValueError(
                f"embedding_dtype must be one of {tuple(_ELEMENT_TYPES)}, got {dtype!r}"
            )
        self.dims = [int(d) for d in dims]
        self.dtype = dtype
        self.optimizer = optimizer
        self.training = bool(training)
        with_state = self.training and optimizer is not None
        self.state_dims = [
            optimizer_state_dim(optimizer, d, OPTIMIZER_STATE_DTYPE) if with_state else 0
            for d in self.dims
        ]
        self.row_bytes = [value_row_bytes(optimizer, d, dtype, self.training) for d in self.dims]
        self.embedding_bytes = [embedding_row_bytes(d, dtype) for d in self.dims]
        self.state_offsets = list(self.embedding_bytes)
        self.max_row_bytes = max(self.row_bytes)
        self.element_type = int(constants()["ElementType"][_ELEMENT_TYPES[dtype]])
        self.scaled = emb.is_scaled(dtype)
        # row_bytes as a tensor, per device: made once (a list copied to a
        # device every call would synchronize).
        self._row_bytes_on: dict[torch.device, torch.Tensor] = {}

    @property
    def num_tables(self) -> int:
        return len(self.dims)

    def embedding_columns(self, table: int) -> int:
        """Columns of ``table``'s embeddings as exported rows and checkpoint
        files carry them (``dynamicemb.io.embeddings.columns``: ``dim``, or
        an FP8 row's bytes)."""
        return emb.columns(self.dtype, self.dims[table])[1]

    def row_bytes_of(self, tids: torch.Tensor) -> torch.Tensor:
        """(n) int64 row bytes of each entry's table, on ``tids``' device."""
        table = self._row_bytes_on.get(tids.device)
        if table is None:
            table = torch.tensor(self.row_bytes, dtype=torch.int64, device=tids.device)
            self._row_bytes_on[tids.device] = table
        return table[tids]

    def dim_groups(self, tids: torch.Tensor):
        """Yields (dim, state_dim, state_offset, index of the entries) for each
        distinct row format among ``tids``' tables (all of them when there is
        one format)."""
        formats = sorted(
            {(d, s, o) for d, s, o in zip(self.dims, self.state_dims, self.state_offsets)}
        )
        if len(formats) == 1:
            d, s, o = formats[0]
            yield d, s, o, None
            return
        for d, s, o in formats:
            tables = [t for t in range(self.num_tables) if self.dims[t] == d]
            sel = torch.isin(tids, torch.tensor(tables, dtype=tids.dtype, device=tids.device))
            idx = sel.nonzero().squeeze(1)
            if idx.numel():
                yield d, s, o, idx

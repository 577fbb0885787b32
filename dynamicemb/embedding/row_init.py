"""The new rows of a ``BatchedDynamicEmbeddingTablesV2``: its initializers'
embeddings and its optimizer's initial state, as its storage asks for them
(``RowInit``), and the fill rows of keys a lookup reads without storing them
(eval misses, keys admission rejected)."""

import torch

from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding.initializer import MultiTableInitializer
from dynamicemb.io import embeddings as emb
from dynamicemb.storage import RowInit, RowLayout
from dynamicemb.storage import space as sp


def fill_refs(positions: torch.Tensor) -> torch.Tensor:
    """The rows values that read fill rows ``positions`` (-2 - i:
    fill_row_ref of cc/embedding/pooling.h)."""
    return -2 - positions


def fill_dtype(module) -> torch.dtype:
    """The element dtype of a module's fill rows: its embedding dtype, or
    uint8 for FP8 (rows of codes and scale, as stored rows are)."""
    return emb.columns(module.embedding_dtype, 1)[0]


def fill_width(module) -> int:
    """Elements of a fill row: the widest embedding, padded as a stored row's
    is, an FP8 row's scale included (init_rows_at writes it so)."""
    dtype = module.embedding_dtype
    return value_row_bytes(None, module.max_dim, dtype, False) // fill_dtype(module).itemsize


class ModuleRowInit(RowInit):
    """A module's new rows: its initializers' embeddings, its optimizer's
    initial state.

    Args:
        module (BatchedDynamicEmbeddingTablesV2): its dims, seed, optimizer,
            embedding dtype and device.
        table_ids (torch.Tensor | None): (num_tables) int64 on the module's
            device, the table ids a key's first row depends on
            (``initializer_table_ids``); None where each table's is its own
            (no per-key lookup of them in a step).
        initializers (dict): ``{False: the training initializer, True: the eval
            initializer}`` (``MultiTableInitializer``).
    """

    def __init__(
        self,
        module,
        table_ids: torch.Tensor | None,
        initializers: dict[bool, MultiTableInitializer],
    ) -> None:
        self.module = module
        self.table_ids = table_ids
        self.initializers = initializers

    def initial(self, keys, tids, eval_mode: bool = False) -> torch.Tensor:
        """(n, max dim) float32: the initializer's (or the eval initializer's)
        row of each key, zeros past its table's dim."""
        m = self.module
        return self.initializers[eval_mode](keys, tids, m.dims, self.table_ids, m.seed)

    def write_rows(self, space, offsets, keys, tids, layout: RowLayout) -> bool:
        """The module's initializer's rows and its optimizer's initial state
        (MultiTableInitializer.write_at: no selection, no synchronization)."""
        m = self.module

        def state(g):
            sdim = layout.state_dims[g.table_list[0]]
            return sdim, m.optimizer.state_fill(sdim)

        self.initializers[False].write_at(
            space,
            offsets,
            keys,
            tids,
            m.dims,
            self.table_ids,
            m.seed,
            layout.element_type,
            state,
        )
        return True

    def embeddings(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        return self.initial(keys, tids)

    def init_state(self, state: torch.Tensor) -> None:
        self.module.optimizer.init_state(state)

    def with_fill(self, rows, idx, keys, tids, initializer: MultiTableInitializer):
        """(rows, fill): the distinct keys at ``idx``, stored nowhere, read
        ``initializer``'s rows (at the embedding dtype, as a stored row would
        read them) from a fill buffer; None when there are none."""
        if idx.numel() == 0:
            return rows, None
        m = self.module
        tids = tids.index_select(0, idx)
        initial = initializer(keys.index_select(0, idx), tids, m.dims, self.table_ids, m.seed)
        if emb.is_scaled(m.embedding_dtype):
            fill = torch.zeros((idx.numel(), fill_width(m)), dtype=torch.uint8, device=m.device)
            sp.pack_rows(fill, tids, m.layout, initial)
        else:
            fill = initial.to(m.embedding_dtype)
        refs = fill_refs(torch.arange(idx.numel(), device=m.device))
        return rows.index_copy(0, idx, refs), fill

    def fill_marked(self, rows, marked, keys, tids, initializer: MultiTableInitializer, width: int):
        """(rows, fill): the j-th marked entry reads fill row j, ``initializer``'s
        row of its key at the embedding dtype (as a stored row reads it). The
        buffer has the batch's length (the number marked is on the device); its
        first rows are written, nothing is selected."""
        m = self.module
        n = keys.numel()
        fill = torch.empty((n, width), dtype=fill_dtype(m), device=m.device)
        rank = torch.cumsum(marked, 0) - 1  # of each marked entry among them
        at = torch.where(marked, rank * (width * fill.element_size()), -1)
        space = (fill.view(torch.uint8).reshape(-1), fill.new_empty(0, dtype=torch.uint8))
        initializer.write_at(
            space, at, keys, tids, m.dims, self.table_ids, m.seed, m.layout.element_type
        )
        return torch.where(marked, fill_refs(rank), rows), fill

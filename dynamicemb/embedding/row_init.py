"""The new rows of a ``BatchedDynamicEmbeddingTablesV2``: its initializers'
embeddings and its optimizer's initial state, as its storage asks for them
(``RowInit``)."""

import torch

from dynamicemb.embedding.initializer import init_rows_at
from dynamicemb.storage import RowInit, RowLayout


class ModuleRowInit(RowInit):
    """A module's new rows: its initializers' embeddings, its optimizer's
    initial state."""

    def __init__(self, module) -> None:
        self.module = module

    def write_rows(self, space, offsets, keys, tids, layout: RowLayout) -> bool:
        """One init_rows_at per initializer group, each over every entry
        (those of other groups at -1): no selection, no synchronization."""
        m = self.module
        init_ids = m._init_table_ids[tids]
        groups = m._initializers[False].groups(m.dims, m.device)
        for g in groups:
            sdim = layout.state_dims[g.table_list[0]]
            at = offsets
            if len(groups) > 1:
                at = torch.where(torch.isin(tids, g.tables), offsets, -1)
            init_rows_at(
                space,
                at,
                keys,
                init_ids,
                g.dim,
                g.op_args,
                m.seed,
                layout.element_type,
                sdim,
                m.optimizer.state_fill(sdim),
            )
        return True

    def embeddings(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        return self.module.initial_embeddings(keys, tids)

    def init_state(self, state: torch.Tensor) -> None:
        self.module.optimizer.init_state(state)

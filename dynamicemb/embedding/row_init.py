"""The new rows of a ``BatchedDynamicEmbeddingTablesV2``: its initializers'
embeddings and its optimizer's initial state, as its storage asks for them
(``RowInit``)."""

import torch

from dynamicemb.storage import RowInit, RowLayout


class ModuleRowInit(RowInit):
    """A module's new rows: its initializers' embeddings, its optimizer's
    initial state."""

    def __init__(self, module) -> None:
        self.module = module

    def write_rows(self, space, offsets, keys, tids, layout: RowLayout) -> bool:
        """The module's initializer's rows and its optimizer's initial state
        (MultiTableInitializer.write_at: no selection, no synchronization)."""
        m = self.module

        def state(g):
            sdim = layout.state_dims[g.table_list[0]]
            return sdim, m.optimizer.state_fill(sdim)

        m._initializers[False].write_at(
            space,
            offsets,
            keys,
            tids,
            m.dims,
            m._init_table_ids,
            m.seed,
            layout.element_type,
            state,
        )
        return True

    def embeddings(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        return self.module.initial_embeddings(keys, tids)

    def init_state(self, state: torch.Tensor) -> None:
        self.module.optimizer.init_state(state)

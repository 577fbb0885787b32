"""Keys a table refuses (``DynamicEmbTableOptions.refuse_cold_keys``): a new
key whose score would be below the lowest of its full bucket is not inserted
(cc/table/operations.h, "Refusal"). In the training step it is looked up like
a key admission rejects: it reads a fill row of the rejected-row initializer
(the admission strategy's, else the table's), is not trained, and is counted
(``StatCol.REFUSALS``), all with device operations only."""

import torch

from dynamicemb.embedding.row_init import ModuleRowInit, fill_width
from dynamicemb.storage import REFUSED_ROW
from dynamicemb.storage.stats import StatCol


class ModuleRefusal:
    """A module's refused keys (see the module docstring).

    Args:
        module (BatchedDynamicEmbeddingTablesV2): its statistics.
        row_init (ModuleRowInit): the module's initializers and fill rows.
    """

    def __init__(self, module, row_init: ModuleRowInit) -> None:
        self.module = module
        self.row_init = row_init
        module.stats.feed(StatCol.REFUSALS)
        self._width = fill_width(module)
        n = len(module.table_options)
        self._zeros = torch.zeros(n, dtype=torch.int64, device=module.device)

    @staticmethod
    def refused(rows: torch.Tensor) -> torch.Tensor:
        """(n) bool: the entries of a training lookup's rows the table refused."""
        return rows == REFUSED_ROW

    def count(self, rows: torch.Tensor, tids: torch.Tensor) -> None:
        """REFUSALS += the refused entries of each table."""
        per_table = self._zeros.index_add(0, tids, self.refused(rows).to(torch.int64))
        self.module.stats.add(StatCol.REFUSALS, per_table)

    def fill(self, rows, keys, tids):
        """(rows, fill) of a lookup without admission: the refused keys read
        fill rows of the table's initializer (``ModuleRowInit.fill_marked``)."""
        init = self.row_init.initializers[False]
        return self.row_init.fill_marked(rows, self.refused(rows), keys, tids, init, self._width)

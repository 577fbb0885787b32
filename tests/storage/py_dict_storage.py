"""PyDictStorage: the reference external storage, a Python dict per table.

The smallest complete ``dynamicemb.types.Storage``: what a parameter server
or key-value store implements to hold a table's rows
(``DynamicEmbTableOptions(external_storage=PyDictStorage, ...)``). The module
constructs it with one ``StorageTable`` per table and its device; rows come
and go as float32 ``(n, value_dim)`` tensors. It keeps every row (never
evicts) and scores each key by insertion order when not given scores.
"""

from collections.abc import Iterator, Sequence

import torch

from dynamicemb.types import MemoryType, Storage, StorageTable


class PyDictStorage(Storage):
    def __init__(self, tables: Sequence[StorageTable], device: torch.device) -> None:
        self.tables = list(tables)
        self.device = torch.device(device)
        # table id -> key -> (row (value_dim) float32 on the CPU, scores (num_scores) int64)
        self.rows: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in self.tables]
        self._clock = 0

    def find(self, keys, table_ids, values) -> torch.Tensor:
        found = torch.zeros(keys.numel(), dtype=torch.bool)
        for i, (k, t) in enumerate(zip(keys.tolist(), table_ids.tolist())):
            row = self.rows[t].get(k)
            if row is not None:
                values[i] = row[0].to(values.device)
                found[i] = True
        return found.to(keys.device)

    def insert(self, keys, table_ids, values, scores=None) -> None:
        values = values.detach().to("cpu", torch.float32)
        for i, (k, t) in enumerate(zip(keys.tolist(), table_ids.tolist())):
            if scores is None:
                self._clock += 1
                s = torch.full((self.tables[t].num_scores,), self._clock, dtype=torch.int64)
            else:
                s = scores[i].detach().cpu().clone()
            self.rows[t][k] = (values[i].clone(), s)

    def erase(self, keys, table_ids) -> None:
        for k, t in zip(keys.tolist(), table_ids.tolist()):
            self.rows[t].pop(k, None)

    def export_batches(
        self, table_id: int, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        items = sorted(self.rows[table_id].items())
        spec = self.tables[table_id]
        for begin in range(0, len(items), batch_size):
            part = items[begin : begin + batch_size]
            keys = torch.tensor([k for k, _ in part], dtype=torch.int64)
            values = torch.stack([r for _, (r, _) in part]).reshape(-1, spec.value_dim)
            scores = torch.stack([s for _, (_, s) in part]).reshape(-1, spec.num_scores)
            yield keys, values, scores

    def size(self, table_id: int) -> int:
        return len(self.rows[table_id])

    def capacity(self, table_id: int) -> int:
        return self.tables[table_id].capacity

    def embedding_dim(self, table_id: int) -> int:
        return self.tables[table_id].embedding_dim

    def value_dim(self, table_id: int) -> int:
        return self.tables[table_id].value_dim

    def embedding_dtype(self, table_id: int) -> torch.dtype:
        return self.tables[table_id].embedding_dtype

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        if mem_type != MemoryType.HOST:
            return 0
        return sum(
            r.numel() * r.element_size() + s.numel() * s.element_size()
            for rows in self.rows
            for r, s in rows.values()
        )

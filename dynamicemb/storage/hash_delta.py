"""The delta rows of a ``HashTableStorage``: what dynamicemb.replication
reaches through the module (``DeltaRows``): rows past a score threshold with
their slots, and writes of keys with their rows at given slots (a replay by
slot) or by key (a replay by key), in the storage's own hash table.
"""

from collections.abc import Iterator, Sequence

import torch

from dynamicemb.storage import space as sp
from dynamicemb.storage.rows import rows_buffer
from dynamicemb.storage.types import DeltaRows, ExportedRows, RowInit
from dynamicemb.table import enums


class HashDelta(DeltaRows):
    """``DeltaRows`` over the hash table of a ``HashTableStorage`` (whose
    ``table``, row layout, ``read``, ``write``, ``rows_of`` and ``insert``
    it uses)."""

    def settle(self, writing: bool) -> None:
        """This table holds every key itself."""

    def export_changed(
        self, table: int, chunk: int, column: int, threshold: int
    ) -> Iterator[ExportedRows]:
        lo, hi = self.table.slot_range(table)
        cols = self.score_columns()
        for begin in range(lo, hi, chunk):
            ex = self.table.export_batch(begin, min(begin + chunk, hi), column, threshold)
            ex = ex.compact()
            rows = self.rows_of(ex.keys, ex.slots, ex.table_ids, ex.scores, table, cols)
            rows.slots = ex.slots - lo
            rows.words = ex.scores
            yield rows

    def write_keys(
        self,
        keys: torch.Tensor,
        slots: torch.Tensor,
        tids: torch.Tensor,
        status: torch.Tensor,
        embeddings: torch.Tensor,
        optimizer_state: torch.Tensor | None,
        init: RowInit,
    ) -> None:
        """The rows of keys just stored at ``slots`` (-1: not stored): their
        embeddings and optimizer state; without one, a key that kept its row
        (status FOUND) keeps its state and the others get the initial state."""
        idx = (slots >= 0).nonzero().squeeze(1)
        s, t = slots[idx], tids[idx]
        buf = rows_buffer(keys[idx], t, embeddings, optimizer_state, idx, init, self.layout)
        if optimizer_state is None and any(self.layout.state_dims):
            kept = (status[idx] == enums.InsertStatus.FOUND).nonzero().squeeze(1)
            if kept.numel():
                _, state = sp.unpack_rows(self.read(s[kept], t[kept]), t[kept], self.layout)
                sp.pack_rows(buf, t[kept], self.layout, None, state, index=kept)
        self.write(
            s, t, sp.as_space(buf), sp.staging_offsets(idx.numel(), self.layout, self.device)
        )

    def check_place(self, table: int, keys: torch.Tensor, slots: torch.Tensor) -> None:
        lo, _ = self.table.slot_range(table)
        self.table.check_place(keys, slots + lo, torch.full_like(keys, table))

    def place(self, table: int, keys, slots, words, embeddings, optimizer_state, init, checked):
        tids = torch.full_like(keys, table)
        lo, _ = self.table.slot_range(table)
        assign = [enums.ScorePolicy.ASSIGN] * self.table.num_scores
        res = self.table.place(
            keys,
            slots + lo,
            tids,
            policies=assign,
            scores=words,
            assign_rows=self.no_eviction,
            checked=checked,
        )
        self.write_keys(keys, res.slots, tids, res.status, embeddings, optimizer_state, init)
        return res

    def upsert(self, table: int, keys, words, embeddings, optimizer_state, init):
        """(``DeltaRows.upsert``; the result as ``insert``'s.)"""
        tids = torch.full_like(keys, table)
        if self.no_eviction:
            slots, status, evicted = self.insert(keys, tids)
        else:
            assign = [enums.ScorePolicy.ASSIGN] * self.table.num_scores
            slots, status, evicted = self.insert(keys, tids, assign, words)
        self.write_keys(keys, slots, tids, status, embeddings, optimizer_state, init)
        return slots, status, evicted

    def erase(self, table: int, keys: torch.Tensor, record: bool) -> torch.Tensor:
        return self.table.erase(keys, torch.full_like(keys, table), record=record)

    def pop_erased(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        return self.table.pop_erased_keys(tables)

"""A device cache over a backing tier (``caching=True``), and the staging of a
batch's rows that do not fit in it.

The cache is a fixed-size ``HashTableStorage`` of device rows; the backing
tier is a host ``HashTableStorage`` holding every key that has left the cache
(with the table's own capacity and expansion), or an external ``Storage``.
See docs/architecture.md, "Storage tiers", for the semantics:

* write-back: a key missing from the cache is inserted into it, its row read
  from the backing tier (or initialized when it is nowhere); the key it evicts
  is written back, with its scores, before the slot is reused;
* a key the cache cannot place (its bucket holds only keys of this batch) is
  staged in the batch's overflow buffer, the second segment of the row space,
  and written back after the update (``after_update``);
* ``prefetch`` brings keys of the next batch the backing tier holds into the
  cache without evicting the rows of the batch in flight.

Without a cache (an external storage with ``caching=False``) every key of a
batch is staged that way.
"""

from collections.abc import Iterator, Sequence

import torch

from dynamicemb.storage import space as sp
from dynamicemb.storage.base import ExportedRows, Footprint, RowInit, TableStorage
from dynamicemb.storage.hash_storage import HashTableStorage
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.rows import write_initial_rows
from dynamicemb.storage.scores import (
    BatchScore,
    batch_policies,
    carry_scores,
    initial_scores,
)
from dynamicemb.table import enums


def _select(values, idx: torch.Tensor):
    """The score values (``batch_policies``) of a subset of a batch's keys:
    a per-key tensor is indexed; a scalar, one row (the STEP score) or None
    stands for every key."""
    if isinstance(values, torch.Tensor) and values.shape[0] != 1:
        return values[idx]
    return values


class _Staged:
    """A batch's rows outside the cache: a staging buffer (the second
    segment of the row space) and what writing them back needs."""

    def __init__(self, buffer, keys, tids, scores, write_back: bool) -> None:
        self.buffer, self.keys, self.tids, self.scores = buffer, keys, tids, scores
        self.write_back = write_back


class CachedStorage(TableStorage):
    """A device cache (or none) over a backing tier.

    Args:
        cache (Optional[HashTableStorage]): the device cache, evicting and of
            fixed size; None stages every key (external storage without
            cache).
        backing: the backing tier: a host ``HashTableStorage`` or an
            ``ExternalBacking``.
        layout (RowLayout): the row format.
        device (torch.device): the storage's device.
        strategies (tuple): the score strategy the cache ranks keys by.
        table_strategies (tuple): the tables' own score strategy.
    """

    def __init__(
        self, cache, backing, layout: RowLayout, device: torch.device, strategies, table_strategies
    ) -> None:
        self.cache: HashTableStorage | None = cache
        self.backing = backing
        self.layout = layout
        self.device = device
        self.strategies = strategies
        self.strategies_of_tables = table_strategies
        # Scores carry between the tiers when both keep the same ones.
        self._carry = (
            cache is not None and backing.has_scores and backing.strategies == cache.strategies
        )
        self.has_cache = cache is not None
        self._staged: _Staged | None = None  # the last training batch's
        self._space_staged: _Staged | None = None  # the last lookup's
        self._held = None  # (keys, tids, slots) the last training batch holds in the cache
        self._last_score = BatchScore(0, None)
        self._prefetch_event = None
        # Keys staged outside the cache, and keys prefetch brought into it.
        self.overflows = torch.zeros((), dtype=torch.int64, device=device)
        self.prefetched = torch.zeros((), dtype=torch.int64, device=device)

    # ---------------------------------------------------------- streams --

    def _join_prefetch(self) -> None:
        """Orders this call after a prefetch made on another stream."""
        if self._prefetch_event is not None:
            torch.cuda.current_stream(self.device).wait_event(self._prefetch_event)
            self._prefetch_event = None

    # ------------------------------------------------------------ lookups --

    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        seg0 = (
            self.cache.space()[0]
            if self.cache is not None
            else torch.empty(0, dtype=torch.uint8, device=self.device)
        )
        st = self._space_staged
        seg1 = st.buffer.view(-1) if st is not None else seg0.new_empty(0)
        return seg0, seg1

    def _size0(self) -> int:
        return 0 if self.cache is None else self.cache.space()[0].numel()

    def train_rows(
        self, keys, tids, counts, score: BatchScore, init: RowInit, num_keys=None, lookup=None
    ) -> torch.Tensor:
        # Never given padded batches (takes_padded_batches is False): num_keys
        # and lookup are None.
        self._join_prefetch()
        self.after_update()  # a previous batch without a backward
        self._last_score = score
        n = keys.numel()
        policies, vals = batch_policies(self.strategies, score, counts)
        if self.cache is not None:
            slots, status, evicted = self._insert_residents_first(keys, tids, policies, vals)
            offsets = self.cache.offsets(slots, tids)
            new = (status == enums.InsertStatus.INSERTED) | (status == enums.InsertStatus.EVICTED)
            failed = status == enums.InsertStatus.FAILED
            miss = new.nonzero().squeeze(1)
            over = failed.nonzero().squeeze(1)
            held = (~failed).nonzero().squeeze(1)
            self._held = (keys[held], tids[held], slots[held])
        else:
            offsets = torch.full_like(keys, -1)
            miss = keys.new_empty(0)
            over = torch.arange(n, device=self.device)
            evicted = None
        m = miss.numel()
        fetch = torch.cat([miss, over])
        found, staged, bscores = self.backing.fetch(keys[fetch], tids[fetch])
        # The victims go back before their slots' rows are overwritten, after
        # the fetch (their write-back may evict a fetched key's backing row).
        if evicted is not None:
            self._write_back_evicted(evicted)
        if m:
            self._fill_cache(
                keys[miss],
                tids[miss],
                slots[miss],
                found[:m],
                staged[:m],
                None if bscores is None else bscores[:m],
                policies,
                _select(vals, miss),
                init,
            )
        self._staged = None
        if over.numel():
            self._stage(
                keys[over],
                tids[over],
                found[m:],
                staged[m:],
                None if bscores is None else bscores[m:],
                policies,
                _select(vals, over),
                init,
                offsets,
                over,
            )
        self._space_staged = self._staged
        return offsets

    def _insert_residents_first(self, keys, tids, policies, vals):
        """The cache's find-or-insert. The table finds the keys it holds
        before any new key of the batch picks a victim (cc/table/operations.h),
        so no key of the batch is evicted and inserted again in one call (its
        row would be lost between the write-back and the fetch). The keys it
        holds are counted for the hit statistics first."""
        if self.cache_observer is not None:
            self.cache_observer(self.cache.table.find(keys, tids) >= 0, tids)
        return self.cache.insert(keys, tids, policies, vals, expand=False)

    def _fill_cache(self, keys, tids, slots, found, staged, bscores, policies, vals, init) -> None:
        """Rows of keys newly placed in the cache: fetched ones copied from
        the staging rows (their scores carried over), new ones initialized."""
        f = found.nonzero().squeeze(1)
        if f.numel():
            self.cache.write(
                slots[f],
                tids[f],
                sp.as_space(staged),
                sp.staging_offsets(staged.shape[0], self.layout, self.device)[f],
            )
            if self._carry:
                s = slots[f]
                fresh = self.cache.table.scores[s]
                self.cache.table.scores[s] = carry_scores(
                    policies, _select(vals, f), bscores[f], fresh
                )
        nf = (~found).nonzero().squeeze(1)
        if nf.numel():
            self.cache.write_new_rows(
                self.cache.offsets(slots[nf], tids[nf]), keys[nf], tids[nf], init
            )

    def _stage(
        self, keys, tids, found, staged, bscores, policies, vals, init, offsets, index
    ) -> None:
        """Stages the keys the cache could not take (the overflow): their
        rows in the staging buffer, addressed after the cache's rows."""
        k = keys.numel()
        nf = (~found).nonzero().squeeze(1)
        if nf.numel():
            write_initial_rows(
                sp.as_space(staged),
                sp.staging_offsets(k, self.layout, self.device)[nf],
                keys[nf],
                tids[nf],
                init,
                self.layout,
            )
        scores = None
        if self.backing.has_scores:  # then there is a cache, with the same scores
            scores = initial_scores(policies, vals, k, self.cache.table.timer(), self.device)
            f = found.nonzero().squeeze(1)
            if f.numel():
                scores[f] = carry_scores(policies, _select(vals, f), bscores[f], scores[f])
        offsets[index] = self._size0() + sp.staging_offsets(k, self.layout, self.device)
        self._staged = _Staged(staged, keys, tids, scores, write_back=True)
        self.overflows += k

    def _write_back_evicted(self, evicted) -> None:
        self._write_back_slots(evicted.compact())

    def _write_back_slots(self, entries) -> None:
        """Writes the cache rows of ``entries`` (keys, table ids, slots and
        scores of cache slots: compacted evicted keys or an export) back to
        the backing tier, scores with them where both tiers keep the same."""
        if entries.keys.numel() == 0:
            return
        rows = self.cache.read(entries.slots, entries.table_ids)
        self.backing.write_back(
            entries.keys,
            entries.table_ids,
            sp.as_space(rows),
            sp.staging_offsets(entries.keys.numel(), self.layout, self.device),
            entries.scores if self._carry else None,
        )

    def after_update(self) -> None:
        st = self._staged
        if st is None or not st.write_back:
            return
        self._staged = None
        self._join_prefetch()
        self.backing.write_back(
            st.keys,
            st.tids,
            sp.as_space(st.buffer),
            sp.staging_offsets(st.keys.numel(), self.layout, self.device),
            st.scores,
        )

    def eval_rows(self, keys, tids) -> torch.Tensor:
        self._join_prefetch()
        if self.cache is not None:
            offsets = self.cache.offsets(self.cache.table.find(keys, tids), tids)
            if self.cache_observer is not None:
                self.cache_observer(offsets >= 0, tids)
        else:
            offsets = torch.full_like(keys, -1)
        miss = (offsets < 0).nonzero().squeeze(1)
        found, staged, _ = self.backing.fetch(keys[miss], tids[miss])
        rows = self._size0() + sp.staging_offsets(miss.numel(), self.layout, self.device)
        offsets[miss] = torch.where(found, rows, -1)
        self._space_staged = _Staged(staged, None, None, None, write_back=False)
        return offsets

    def contains(self, keys, tids) -> torch.Tensor:
        self._join_prefetch()
        held = self.backing.contains(keys, tids)
        if self.cache is not None:
            held |= self.cache.contains(keys, tids)
        return held

    # ----------------------------------------------------------- prefetch --

    def prefetch(self, keys, tids, forward_stream=None) -> None:
        if self.cache is None or keys.numel() == 0:
            return
        cuda = self.device.type == "cuda"
        if cuda:
            stream = torch.cuda.current_stream(self.device)
            if forward_stream is not None and forward_stream != stream:
                # Room in the backing tier for every victim this can write
                # back, made on the forward stream: the write-backs on this
                # stream then never reallocate the backing table (whose old
                # blocks the forward stream's allocator would reuse while this
                # stream still read them).
                room = self.backing.room_for(tids)  # host counts: no tensor crosses streams
                if room is not None:
                    with torch.cuda.stream(forward_stream):
                        self.backing.reserve(room)
                # After the forward enqueued so far (it wrote the cache's metadata).
                stream.wait_stream(forward_stream)
        cand = (self.cache.table.find(keys, tids) < 0).nonzero().squeeze(1)
        st = self._staged
        if st is not None and cand.numel():
            # Rows the batch in flight stages are stale in the backing tier.
            cand = cand[~torch.isin(keys[cand], st.keys)]
        found, staged, bscores = self.backing.fetch(keys[cand], tids[cand])
        f = found.nonzero().squeeze(1)
        if f.numel():
            self._prefetch_into_cache(
                keys[cand][f], tids[cand][f], staged[f], None if bscores is None else bscores[f]
            )
        if cuda:
            self._prefetch_event = torch.cuda.Event()
            self._prefetch_event.record(torch.cuda.current_stream(self.device))

    def _prefetch_into_cache(self, keys, tids, staged, bscores) -> None:
        cache = self.cache
        if bscores is None or not self._carry:
            policies, vals = batch_policies(
                self.strategies, self._last_score, torch.zeros_like(keys)
            )
            bscores = initial_scores(policies, vals, keys.numel(), cache.table.timer(), self.device)
        # The batch in flight holds its cache slots until its backward: they
        # go into the same call, which never evicts a slot it holds, with the
        # scores they have.
        if self._held is not None and self._held[0].numel():
            hk, ht, hs = self._held
            all_keys = torch.cat([hk, keys])
            all_tids = torch.cat([ht, tids])
            all_scores = torch.cat([cache.table.scores[hs], bscores])
        else:
            all_keys, all_tids, all_scores = keys, tids, bscores
        assign = [enums.ScorePolicy.ASSIGN] * cache.table.num_scores
        slots, status, evicted = cache.insert(all_keys, all_tids, assign, all_scores, expand=False)
        self._write_back_evicted(evicted)
        h = all_keys.numel() - keys.numel()
        slots, status = slots[h:], status[h:]
        placed = (
            ((status == enums.InsertStatus.INSERTED) | (status == enums.InsertStatus.EVICTED))
            .nonzero()
            .squeeze(1)
        )
        self.prefetched += placed.numel()
        if placed.numel():
            cache.write(
                slots[placed],
                tids[placed],
                sp.as_space(staged),
                sp.staging_offsets(keys.numel(), self.layout, self.device)[placed],
            )

    # -------------------------------------------------------------- flush --

    def flush(self) -> None:
        self._join_prefetch()
        if self.cache is None:
            return
        self._write_back_slots(self.cache.table.export_batch().compact())

    def purge(self) -> None:
        self.flush()
        if self.cache is None:
            return
        self.cache.clear_tables(range(self.cache.table.num_tables))
        self._held = None

    # -------------------------------------------------------- checkpoints --

    def export_rows(self, table: int, chunk: int) -> Iterator[ExportedRows]:
        self._join_prefetch()
        if self.cache is not None:
            # The cache keeps the table's scores, except for NO_EVICTION (none).
            cols = (
                None
                if self.cache.strategies != self.strategies_of_tables
                else self.cache.score_columns()
            )
            lo, hi = self.cache.table.slot_range(table)
            for begin in range(lo, hi, chunk):
                ex = self.cache.table.export_batch(begin, min(begin + chunk, hi)).compact()
                if ex.keys.numel():
                    yield self.cache.rows_of(
                        ex.keys, ex.slots, ex.table_ids, ex.scores, table, cols
                    )
        for rows in self.backing.export_rows(table, chunk):
            if self.cache is not None and rows.keys.numel():
                tids = torch.full_like(rows.keys, table)
                keep = ~self.cache.contains(rows.keys, tids)
                rows = ExportedRows(
                    rows.keys[keep],
                    None if rows.scores is None else rows.scores[keep],
                    rows.embeddings[keep],
                    None if rows.optimizer_state is None else rows.optimizer_state[keep],
                )
            yield rows

    def import_rows(self, table, keys, scores, embeddings, optimizer_state, init) -> torch.Tensor:
        self._join_prefetch()
        keys = keys.to(self.device)
        if self.cache is not None:
            # A cached copy would hide the imported row.
            self.cache.table.erase(keys, torch.full_like(keys, table))
            self._held = None
        return self.backing.import_rows(table, keys, scores, embeddings, optimizer_state, init)

    def clear_tables(self, tables: Sequence[int]) -> None:
        self._join_prefetch()
        if self.cache is not None:
            self.cache.clear_tables(tables)
        self.backing.clear_tables(tables)
        self._held = None

    def reserve_rows(self, table: int, incoming: int) -> None:
        self.backing.reserve_rows(table, incoming)

    def snapshot(self) -> dict:
        self._join_prefetch()
        return {
            "cache": None if self.cache is None else self.cache.snapshot(),
            "backing": self.backing.snapshot(),
            "held": self._held,
        }

    def restore(self, snapshot: dict) -> None:
        if self.cache is not None:
            self.cache.restore(snapshot["cache"])
        self.backing.restore(snapshot["backing"])
        self._held = snapshot["held"]

    # ---------------------------------------------------------- accounting --

    def footprint(self) -> Footprint:
        b = self.backing.footprint()
        if self.cache is None:
            return b
        c = self.cache.footprint()
        return Footprint(device=b.device + c.device, host=b.host + c.host)

    def footprint_per_table(self) -> list[Footprint]:
        b = self.backing.footprint_per_table()
        if self.cache is None:
            return b
        return [
            Footprint(device=x.device + y.device, host=x.host + y.host)
            for x, y in zip(b, self.cache.footprint_per_table())
        ]

    def sizes(self) -> list[int]:
        sizes = self.backing.sizes()
        if self.cache is None:
            return sizes
        ex = self.cache.table.export_batch().compact()
        only_cached = ~self.backing.contains(ex.keys, ex.table_ids)
        extra = torch.bincount(ex.table_ids[only_cached], minlength=len(sizes)).tolist()
        return [s + int(e) for s, e in zip(sizes, extra)]

    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        return self.backing.pop_evicted_keys(tables)

    def hash_tier(self, writing: bool):
        """The backing table, once the cache is written back (and, when
        ``writing``, emptied, so that no cached copy hides what is written)."""
        if not isinstance(self.backing, HashTableStorage):
            return super().hash_tier(writing)
        if writing:
            self.purge()
        else:
            self.flush()
        return self.backing

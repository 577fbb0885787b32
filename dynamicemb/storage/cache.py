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

A backing tier that ``can_fail`` (a user's ``Storage``) is read before the
cache changes, and a step keeps an ``Undo`` record until its rows are
written back: when the tier raises, the cache is put back as it was before
the step (docs/storage.md, "A storage that raises").
"""

from collections.abc import Iterator, Sequence

import torch
from torch.profiler import record_function

from dynamicemb.storage import padded
from dynamicemb.storage import space as sp
from dynamicemb.storage.cache_prefetch import PrefetchSteps
from dynamicemb.storage.cache_staging import Located, Staged, StagedSteps, Undo, select_values
from dynamicemb.storage.hash_storage import HashTableStorage
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.scores import (
    BatchScore,
    batch_policies,
    carry_scores,
)
from dynamicemb.storage.types import (
    Backing,
    DeltaRows,
    ExportedRows,
    Footprint,
    HostBacking,
    StepGraphs,
    TableStorage,
)
from dynamicemb.table import enums


class CachedStorage(StagedSteps, PrefetchSteps, TableStorage):
    """A device cache (or none) over a backing tier (``Backing``). Over a
    host table it is a ``CachedHashStorage``, which adds the faces of the hash
    table holding every key.

    Args:
        cache (Optional[HashTableStorage]): the device cache, evicting and of
            fixed size; None stages every key (external storage without
            cache).
        backing (Backing): the backing tier: a host ``HashTableStorage`` or an
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
        self.backing: Backing = backing
        self.layout = layout
        self.device = device
        self.strategies = strategies
        self.strategies_of_tables = table_strategies
        # Scores carry between the tiers when both keep the same ones.
        self._carry = (
            cache is not None and backing.has_scores and backing.strategies == cache.strategies
        )
        self.has_cache = cache is not None
        self._staged: Staged | None = None  # the last training batch's
        self._space_staged: Staged | None = None  # the last lookup's
        self._held = None  # (keys, tids, slots) the last training batch holds in the cache
        # (keys, tids, backing slots) of the last training batch's keys the
        # cache could not take, whose rows the update writes in the backing tier.
        self._overflow = None
        self._last_score = BatchScore(0, None)
        # A backing tier that may raise (a user's storage): a step keeps an
        # undo record until its rows are written back (``Undo``).
        self._fallible = backing.can_fail
        # A cache over a host table: keys the cache cannot take are found or
        # inserted in the backing table, whose (pinned, mapped) rows the
        # kernels address in place; a step then reads nothing on the host.
        # Otherwise they are staged (``_stage``).
        self._direct = cache is not None and not self._fallible and isinstance(backing, HostBacking)
        self._undo: Undo | None = None
        self._prefetch_event = None
        # The end of the last training lookup or update, on its stream (first
        # the tiers' creation): what a prefetch on another stream waits for.
        self._train_event = None
        self._train_stream = None
        self._record_train()
        # Keys staged outside the cache, and keys prefetch brought into it;
        # rows read from the backing tier and written back to it.
        zero = torch.zeros((), dtype=torch.int64, device=device)
        self.overflows, self.prefetched = zero, zero.clone()
        self.host_reads, self.host_writes = zero.clone(), zero.clone()
        # The companion's hooks: a lookup's, a prefetch's.
        self.graphs = StepGraphs(
            state=self._graph_state,
            before_lookup=self._begin_step,
            lookup_state=self._in_flight,
            replayed=self._replayed,
            prefetch_state=self._prefetch_graph_state,
            before_prefetch=self._before_prefetch,
            prefetch_rows=self._prefetch_rows,
            after_prefetch=self._after_prefetch,
            prefetch_taken=self._take_writes,
        )

    # ---------------------------------------------------------- streams --

    def _join_prefetch(self) -> None:
        """Orders this call after a prefetch made on another stream."""
        if self._prefetch_event is not None:
            torch.cuda.current_stream(self.device).wait_event(self._prefetch_event)
            self._prefetch_event = None
        self._wait_writes()
        # What a later prefetch on another stream waits for: the work queued
        # on this call's stream so far.
        self._record_train()

    def _wait_writes(self) -> None:
        """Orders this call after the victims' rows on their way to the host
        table (``HostWrites``)."""
        if self._direct:
            self.backing.writes.wait()

    # ------------------------------------------------------------ lookups --

    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        seg0 = (
            self.cache.space()[0]
            if self.cache is not None
            else torch.empty(0, dtype=torch.uint8, device=self.device)
        )
        st = self._space_staged
        if st is not None:
            return seg0, st.buffer.view(-1)
        if self._direct:
            return seg0, self.backing.space()[1]
        return seg0, seg0.new_empty(0)

    def _size0(self) -> int:
        return 0 if self.cache is None else self.cache.space()[0].numel()

    @property
    def takes_padded_batches(self) -> bool:
        return self._direct

    def _graph_state(self) -> tuple | None:
        """``graphs.state``: a cache over a host table, both as
        ``HashTableStorage``'s requires (evicting, at their capacity, no victim
        scorer, no evicted keys kept): its training lookup neither
        synchronizes nor moves a tensor."""
        if not self._direct:
            return None
        cache, backing = self.cache.graphs.state(), self.backing.graphs.state()
        if cache is None or backing is None:
            return None
        own = (self.overflows, self.host_reads, self.host_writes, self.backing.dropped)
        writes = self.backing.writes
        return (*cache, *backing, *(x.data_ptr() for x in own), writes.rows, writes.max_rows)

    def _begin_step(self) -> None:
        """Before a training lookup (``graphs.before_lookup``): after a
        prefetch on another stream, and after the write-back of a previous
        batch that had no backward."""
        self._join_prefetch()
        self.after_update()

    def _in_flight(self):
        """``graphs.lookup_state``: the batch in flight, and the victims' rows
        the captured lookup staged (written after each replay)."""
        return self._held, self._overflow, self._last_score, self._take_writes()

    def _replayed(self, state) -> None:
        """``graphs.replayed``: the batch in flight of a replayed lookup; its
        victims' rows on their way to the host table."""
        self._held, self._overflow, self._last_score, writes = state
        self._staged = self._space_staged = self._undo = None
        self._record_train()
        self._submit_writes(writes)

    def _take_writes(self):
        """The victims' rows a captured call staged (``HostWrites.take``)."""
        return self.backing.writes.take() if self._direct else []

    def _submit_writes(self, writes=None) -> None:
        """Sends the victims' rows staged by this call (and ``writes``, a
        replayed graph's) to the host table on the bus stream."""
        if self._direct:
            with record_function("dynamicemb:cache_write_back"):
                self.backing.writes.put(writes or [])
                self.backing.writes.submit()

    def train_rows(
        self, keys, tids, counts, score: BatchScore, init, num_keys=None, lookup=None
    ) -> torch.Tensor:
        if self._direct:
            return padded.train_padded(
                self._train_cached, keys, tids, counts, score, init, num_keys, lookup
            )
        return self._train_staged(keys, tids, counts, score, init)

    def _capturing(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _train_cached(self, keys, tids, counts, score: BatchScore, init) -> torch.Tensor:
        """The training lookup of a cache over a host table (``_direct``), on
        exact (CPU) or padded (GPU) batches, reading nothing on the host
        unless the backing table still grows; what it sets on the host a
        replay of its CUDA graph puts back (``graphs.replayed``)."""
        capturing = self._capturing()
        if not capturing:  # else done by graphs.before_lookup
            self._begin_step()
        self._last_score = score
        self._staged = self._space_staged = self._undo = None
        status_of = enums.InsertStatus
        policies, vals = batch_policies(self.strategies, score, counts)
        with record_function("dynamicemb:cache_insert"):
            # One find-or-insert in the cache: the keys it holds are found before
            # any new key of the batch picks a victim (cc/table/operations.h), so
            # no key of the batch is evicted and inserted again in one call.
            slots, status, evicted = self.cache.insert(keys, tids, policies, vals, expand=False)
            offsets = self.cache.offsets(slots, tids)
            miss = (status == status_of.INSERTED) | (status == status_of.EVICTED)
            over = status == status_of.FAILED
            if self.cache_observer is not None:
                self.cache_observer(status == status_of.FOUND, miss | over, tids)
        with record_function("dynamicemb:cache_backing"):
            self._held = (keys, tids, slots)
            victims = self._victims(evicted)
            osub = sp.Subset(over)
            okeys, (otids, ocounts) = osub.keys(keys), osub.take(tids, counts)
            # Room in the backing table for the victims and the keys the cache
            # cannot take (a table at its capacity reads nothing).
            grow = [okeys] + ([] if victims is None else [victims[0]])
            grow_t = [otids] + ([] if victims is None else [victims[1]])
            self.backing.expand_for(torch.cat(grow), torch.cat(grow_t))
            # Where the backing tier holds the rows of the keys the cache
            # missed or cannot take; the victims go back before their slots
            # are refilled, without evicting those rows.
            loc = self._locate(miss | over, keys, tids)
            self.host_reads += loc.found.sum()
            ns, no, nmiss = loc.sub.take(slots, offsets, miss)
            self._write_back_victims(victims, loc, evicted)
        with record_function("dynamicemb:cache_fill"):
            self._fill_misses(loc, nmiss, ns, no, policies, vals, init)
        with record_function("dynamicemb:cache_overflow"):
            oscore = BatchScore(score.step, select_values(score.custom, osub))
            rows = self._place_overflow(okeys, otids, ocounts, oscore, init)
            self.overflows += osub.on.sum()
            if osub.idx is None:
                offsets = torch.where(over, rows, offsets)
            else:
                offsets = offsets.index_copy(0, osub.idx, rows)
            # A victim whose host slot a key placed there since took (a full
            # host table evicted it) is not written: its row is lost, as
            # the last tier's victims are.
            self.backing.drop_moved_writes()
        if not capturing:
            self._record_train()
            self._submit_writes()
        return offsets

    def _fill_misses(self, loc: Located, nmiss, slots, offsets, policies, vals, init) -> None:
        """The cache slots (``slots``, at ``offsets``) of the keys it missed
        (``nmiss`` of the located subset ``loc``) get their rows: copied from
        the backing tier where it holds them (their scores carried on),
        initialized otherwise."""
        fill = loc.sub.on & nmiss
        sp.copy_rows(
            self.cache.space(),
            torch.where(loc.found & fill, offsets, -1),
            loc.src,
            loc.offsets,
            self.layout.row_bytes_of(loc.tids),
            by=self._host_side("src"),
        )
        new = torch.where(fill & ~loc.found, offsets, -1)
        self.cache.write_new_rows(new, loc.keys, loc.tids, init)
        if self._carry:
            held = fill & loc.found
            self._carry_scores(slots, held, loc.scores, policies, select_values(vals, loc.sub))

    def _place_overflow(self, keys, tids, counts, score: BatchScore, init) -> torch.Tensor:
        """Finds or inserts the keys the cache could not take (``PAD_KEY``
        entries left out) in the backing table, new rows initialized there,
        and returns their offsets in the row space (``space()``'s second
        segment is the backing table's host rows), -1 where not stored. The
        kernels read and update those rows in host memory; until the update
        (``after_update``) a prefetch neither brings them into the cache nor
        evicts them."""
        backing = self.backing
        bslots, boff = backing.insert_rows(keys, tids, counts, score, init, expand=False)
        self._overflow = (keys, tids, bslots)
        placed = boff >= 0
        self.host_writes += placed.sum()
        base = self._size0() - backing.space()[0].numel()
        return torch.where(placed, boff + base, -1)

    def _victims(self, evicted, count: int | None = None):
        """``(keys, table ids, slots, scores)`` of the keys an insert into the
        cache evicted (``count`` of them, when known on the host): an
        ``sp.Subset`` of the valid ones (left out on a GPU: ``PAD_KEY`` at
        slot -1); None when the call could evict nothing."""
        if evicted is None or evicted.keys.numel() == 0 or count == 0:
            return None
        if count is not None:  # the valid prefix, without a selection
            self.host_writes += count
            ex = evicted.compact(count)
            return ex.keys, ex.table_ids, ex.slots, ex.scores
        valid = torch.arange(evicted.keys.numel(), device=self.device) < evicted.count
        self.host_writes += valid.sum()
        sub = sp.Subset(valid)
        vt, vs, vscores = sub.take(evicted.table_ids, evicted.slots, evicted.scores)
        if sub.idx is None:  # past the count: no row, a valid table id
            vt, vs = torch.where(valid, vt, 0), torch.where(valid, vs, -1)
        return sub.keys(evicted.keys), vt, vs, vscores

    def _locate(self, mask, keys, tids, size: int | None = None) -> Located:
        """Where the backing tier holds the rows of the keys ``mask`` selects
        (``size`` of them, when known on the host)."""
        sub = sp.Subset(mask, size)
        k, (t,) = sub.keys(keys), sub.take(tids)
        found, src, offsets, scores = self.backing.locate(k, t)
        return Located(sub, k, t, found, src, offsets, scores)

    def _write_back_victims(self, victims, loc: Located, evicted=None) -> None:
        """Writes the cache rows of evicted keys back to the backing tier
        (their scores with them where both tiers keep the same), the keys
        ``loc`` found there protected from eviction until their rows are
        read. Over a host table the rows are staged (``HostWrites``): copied
        out of their cache slots now, written to the host table on the bus
        stream (``_submit_writes``); ``evicted``'s count says how many
        there are."""
        if victims is None:
            return
        vk, vt, vs, vscores = victims
        protect = None
        if self._carry and loc.scores is not None:
            held = sp.Subset(loc.found)
            protect = (held.keys(loc.keys), *held.take(loc.tids, loc.scores))
        if self._overflow is not None and self._carry:
            # The batch in flight's keys the cache could not take: the update
            # still writes their rows in the backing table.
            ok, ot, oslots = self._overflow
            kept = sp.Subset(oslots >= 0)
            kt, ks = kept.take(ot, oslots)
            okept = (kept.keys(ok), kt, self.backing.scores_at(ks))
            protect = okept if protect is None else tuple(map(torch.cat, zip(protect, okept)))
        staged = {}
        if self._direct:
            count = None if evicted is None or vk.numel() != evicted.keys.numel() else evicted.count
            staged = {"staged": True, "count": count}
        self.backing.write_back(
            vk,
            vt,
            self.cache.space(),
            self.cache.offsets(vs, vt),
            vscores if self._carry else None,
            protect=protect,
            expand=False,
            **staged,
        )

    def _carry_scores(self, slots, carried_mask, bscores, policies, vals) -> None:
        """The scores of keys the cache took from the backing tier
        (``carried_mask``, at cache ``slots``) continue the ones they had
        there."""
        fresh = self.cache.table.scores[slots.clamp(min=0)]
        carried = carry_scores(policies, vals, bscores, fresh)
        sp.scatter_rows(self.cache.table.scores, torch.where(carried_mask, slots, -1), carried)

    def _host_side(self, side: str) -> str | None:
        """``copy_rows``'s ``by`` for a copy whose ``side`` is the backing
        tier's rows: that side over a host table (its rows in host memory,
        reached in address order), None over an external tier (a staging
        buffer in device memory)."""
        return side if self._direct else None

    def _record_train(self) -> None:
        """Marks the end of the work of a training lookup (or of its update)
        on the cache, which a prefetch on another stream waits for."""
        if self.device.type == "cuda":
            self._train_stream = torch.cuda.current_stream(self.device)
            self._train_event = torch.cuda.Event()
            self._train_event.record(self._train_stream)

    def _write_back_slots(self, entries) -> None:
        """Writes the cache rows of ``entries`` (keys, table ids, slots and
        scores of cache slots: an export) back to the backing tier, scores
        with them where both tiers keep the same."""
        if entries.keys.numel() == 0:
            return
        self.backing.write_back(
            entries.keys,
            entries.table_ids,
            self.cache.space(),
            self.cache.offsets(entries.slots, entries.table_ids),
            entries.scores if self._carry else None,
        )

    def after_update(self) -> None:
        # The batch's cache slots are free for a prefetch once its update has
        # run: the prefetch waits for the event recorded here.
        self._held = self._overflow = None
        st = self._staged
        undo, self._undo = self._undo, None
        if st is not None and st.write_back:
            self._staged = None
            self._join_prefetch()
            self.host_writes += st.keys.numel()
            put_back = {} if st.before is None else {"before": st.before}
            try:
                self.backing.write_back(
                    st.keys,
                    st.tids,
                    sp.as_space(st.buffer),
                    sp.staging_offsets(st.keys.numel(), self.layout, self.device),
                    st.scores,
                    **put_back,
                )
            except BaseException:
                if undo is not None:
                    self._roll_back(undo)
                raise
        self._record_train()

    def eval_rows(self, keys, tids) -> torch.Tensor:
        self._join_prefetch()
        if self.cache is not None:
            offsets = self.cache.offsets(self.cache.table.find(keys, tids), tids)
            if self.cache_observer is not None:
                self.cache_observer(offsets >= 0, offsets < 0, tids)
        else:
            offsets = torch.full_like(keys, -1)
        miss = (offsets < 0).nonzero().squeeze(1)
        found, staged, _ = self.backing.fetch(keys[miss], tids[miss])
        rows = self._size0() + sp.staging_offsets(miss.numel(), self.layout, self.device)
        offsets[miss] = torch.where(found, rows, -1)
        self._space_staged = Staged(staged, None, None, None, write_back=False)
        return offsets

    def contains(self, keys, tids) -> torch.Tensor:
        self._join_prefetch()
        held = self.backing.contains(keys, tids)
        if self.cache is not None:
            held |= self.cache.contains(keys, tids)
        return held

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

    def capacity(self, table: int) -> int:
        return self.backing.capacity(table)

    def limit(self, table: int) -> int:
        return self.backing.limit(table)

    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        return self.backing.pop_evicted_keys(tables)


class CachedHashStorage(CachedStorage, DeltaRows):
    """A device cache over a host ``HashTableStorage``: the hash table that
    holds every key is the backing table's, where incremental dumps read and
    replays write once the cache is written back (``settle``). Takes the
    arguments of ``CachedStorage``."""

    backing: HashTableStorage

    @property
    def hash_table(self):
        return self.backing.hash_table

    def settle(self, writing: bool) -> None:
        """Writes the cache back, and, when ``writing``, empties it, so that
        no cached copy hides what is written."""
        if writing:
            self.purge()
        else:
            self.flush()

    def export_changed(self, table: int, chunk: int, column: int, threshold: int):
        return self.backing.export_changed(table, chunk, column, threshold)

    def check_place(self, table: int, keys: torch.Tensor, slots: torch.Tensor) -> None:
        self.backing.check_place(table, keys, slots)

    def place(self, table: int, keys, slots, words, embeddings, optimizer_state, init, checked):
        return self.backing.place(
            table, keys, slots, words, embeddings, optimizer_state, init, checked
        )

    def upsert(self, table: int, keys, words, embeddings, optimizer_state, init):
        return self.backing.upsert(table, keys, words, embeddings, optimizer_state, init)

    def erase(self, table: int, keys: torch.Tensor, record: bool) -> torch.Tensor:
        return self.backing.erase(table, keys, record)

    def pop_erased(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        return self.backing.pop_erased(tables)

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
cache changes, and a step keeps an ``_Undo`` record until its rows are
written back: when the tier raises, the cache is put back as it was before
the step (docs/storage.md, "A storage that raises").
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.profiler import record_function

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
from dynamicemb.table import PAD_KEY, enums


def _select(values, sub: "sp.Subset"):
    """The score values (``batch_policies``) of a subset of a batch's keys:
    a per-key tensor is restricted like them; a scalar, one row (the STEP
    score) or None stands for every key."""
    if isinstance(values, torch.Tensor) and values.shape[0] != 1:
        (values,) = sub.take(values)
    return values


@dataclass
class _Located:
    """Where the backing tier holds the rows of a subset of a batch's keys:
    the ``Subset``, its entries' keys (``PAD_KEY`` where left out on a GPU)
    and table ids, and ``locate``'s results (found, the row space, offsets,
    scores)."""

    sub: sp.Subset
    keys: torch.Tensor
    tids: torch.Tensor
    found: torch.Tensor
    src: tuple[torch.Tensor, torch.Tensor]
    offsets: torch.Tensor
    scores: torch.Tensor | None


class _Staged:
    """A batch's rows outside the cache: a staging buffer (the second
    segment of the row space) and what writing them back needs."""

    def __init__(self, buffer, keys, tids, scores, write_back: bool, before=None) -> None:
        self.buffer, self.keys, self.tids, self.scores = buffer, keys, tids, scores
        self.write_back = write_back
        # For a backing tier that can fail: (found (n) bool, a copy of the
        # rows before the update), what its write-back puts back on failure.
        self.before = before


@dataclass
class _Undo:
    """What a training step changed in the cache, to put back when the
    backing tier fails before the step's end (a backing that ``can_fail``):
    the counters, the keys it placed in the cache (erased), the keys it
    evicted (placed back at their slots with their scores and rows) and the
    slots, scores and rows of the keys it found (put back: an update or a
    score may have changed them)."""

    counters: tuple[torch.Tensor, ...]
    new: tuple[torch.Tensor, torch.Tensor] | None = None
    victims: tuple | None = None
    victim_rows: torch.Tensor | None = None
    found: tuple | None = None


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
        # A backing tier that may raise (a user's storage): a step keeps an
        # undo record until its rows are written back (``_Undo``).
        self._fallible = bool(getattr(backing, "can_fail", False))
        self._undo: _Undo | None = None
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

    # ---------------------------------------------------------- streams --

    def _join_prefetch(self) -> None:
        """Orders this call after a prefetch made on another stream."""
        if self._prefetch_event is not None:
            torch.cuda.current_stream(self.device).wait_event(self._prefetch_event)
            self._prefetch_event = None
        # The end of the last training lookup or update, on its stream (first
        # the tiers' creation): what a prefetch on another stream waits for.
        self._train_event = None
        self._train_stream = None
        self._record_train()

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
        policies, vals = batch_policies(self.strategies, score, counts)
        self._staged = None
        undo = _Undo(self._counters()) if self._fallible else None
        if self.cache is None:  # every key staged
            offsets = torch.full_like(keys, -1)
            loc = self._locate(torch.ones_like(keys, dtype=torch.bool), keys, tids, keys.numel())
            self.host_reads += loc.found.sum()
            self._stage(keys, tids, loc, policies, vals, init, offsets, keys.numel())
            self._space_staged = self._staged
            self._undo = undo
            return offsets
        loc = None
        if undo is not None:
            # The backing tier is read first, before anything changes: the
            # rows of the keys the cache does not hold (those it will miss or
            # cannot take). The found keys' slots, scores and rows are kept.
            pre = self.cache.table.find(keys, tids)
            held = pre >= 0
            hs, ht = pre[held], tids[held]
            hoff = self.cache.offsets(hs, ht)
            rows = sp.stage_rows(self.cache.space(), hoff, ht, self.layout)
            undo.found = (hs, ht, self.cache.table.scores[hs].clone(), rows)
            loc = self._locate(~held, keys, tids, int((~held).sum()))
        with record_function("dynamicemb:cache_insert"):
            # One find-or-insert in the cache: the keys it holds are found before
            # any new key of the batch picks a victim (cc/table/operations.h), so
            # no key of the batch is evicted and inserted again in one call.
            slots, status, evicted = self.cache.insert(keys, tids, policies, vals, expand=False)
            if self.cache_observer is not None:
                self.cache_observer(status == enums.InsertStatus.FOUND, tids)
            offsets = self.cache.offsets(slots, tids)
            miss = (status == enums.InsertStatus.INSERTED) | (status == enums.InsertStatus.EVICTED)
            over = status == enums.InsertStatus.FAILED
            need = miss | over
        with record_function("dynamicemb:cache_read_counts"):
            # The one read of the step: how many keys the cache could not take
            # (their staging buffer's size), missed or could not take, evicted
            # (the sizes of the subsets the backing tier works on).
            n_over, n_need, n_victims = (
                int(x) for x in torch.stack([over.sum(), need.sum(), evicted.count[0]]).tolist()
            )
        with record_function("dynamicemb:cache_backing"):
            self._held = (keys, tids, slots)
            victims = self._victims(evicted, n_victims)
            if victims is not None:
                self.backing.expand_for(victims[0], victims[1])
            if undo is not None:
                undo.new = (keys[miss], tids[miss])
                undo.victims, undo.victim_rows = victims, self._rows_at(victims)
            # Where the backing tier holds the rows of the keys the cache misses
            # (and those it cannot take); the victims go back before their slots
            # are refilled, without evicting those rows.
            if loc is None:
                loc = self._locate(need, keys, tids, n_need)
            self.host_reads += loc.found.sum()
            ns, no, nmiss = loc.sub.take(slots, offsets, miss)
            try:
                self._write_back_victims(victims, loc)
            except BaseException:
                if undo is not None:
                    self._roll_back(undo)
                raise
        with record_function("dynamicemb:cache_fill"):
            fill = loc.sub.on & nmiss
            sp.copy_rows(
                self.cache.space(),
                torch.where(loc.found & fill, no, -1),
                loc.src,
                loc.offsets,
                self.layout.row_bytes_of(loc.tids),
            )
            new_at = torch.where(fill & ~loc.found, no, -1)
            self.cache.write_new_rows(new_at, loc.keys, loc.tids, init)
            if self._carry:
                carried = fill & loc.found
                self._carry_scores(ns, carried, loc.scores, policies, _select(vals, loc.sub))
            if n_over:
                staged = loc.sub.on & ~nmiss
                self._stage(keys, tids, loc, policies, vals, init, offsets, n_over, staged)
        self._space_staged = self._staged
        self._undo = undo
        self._record_train()
        return offsets

    # --------------------------------------------------------------- undo --

    def _counters(self) -> tuple[torch.Tensor, ...]:
        """Copies of the row counters, for ``_Undo``."""
        return tuple(c.clone() for c in (self.overflows, self.host_reads, self.host_writes))

    def _rows_at(self, victims) -> torch.Tensor | None:
        """A staging copy of the cache rows of evicted keys (``_victims``),
        taken before their slots are refilled."""
        if victims is None:
            return None
        _, vt, vs, _ = victims
        return sp.stage_rows(self.cache.space(), self.cache.offsets(vs, vt), vt, self.layout)

    def _restore_cache(self, undo: _Undo) -> None:
        """Puts the cache back as ``undo`` recorded it: the keys placed are
        erased, the evicted ones placed back at their slots with their scores
        and rows, the found ones get their scores and rows back."""
        table, space = self.cache.table, self.cache.space()
        if undo.new is not None:
            keys, tids = undo.new
            ok = (keys != PAD_KEY).nonzero().squeeze(1)  # entries left out on a GPU
            if ok.numel():
                table.erase(keys[ok], tids[ok])
        if undo.victims is not None:
            vk, vt, vs, vscores = undo.victims
            ok = (vs >= 0).nonzero().squeeze(1)
            if ok.numel():
                vk, vt, vs, vscores = vk[ok], vt[ok], vs[ok], vscores[ok]
                assign = [enums.ScorePolicy.ASSIGN] * table.num_scores
                table.place(vk, vs, vt, assign, vscores)
                self._copy_back(space, vs, vt, undo.victim_rows[ok])
        if undo.found is not None and undo.found[0].numel():
            hs, ht, scores, rows = undo.found
            table.scores[hs] = scores
            self._copy_back(space, hs, ht, rows)

    def _copy_back(self, space, slots, tids, rows) -> None:
        """Copies a staging buffer of rows into the cache slots ``slots``."""
        sp.copy_rows(
            space,
            self.cache.offsets(slots, tids),
            sp.as_space(rows),
            sp.staging_offsets(slots.numel(), self.layout, self.device),
            self.layout.row_bytes_of(tids),
        )

    def _roll_back(self, undo: _Undo) -> None:
        """Undoes a training step whose backing tier failed: the cache as it
        was, the counters, nothing staged (the backing tier put back its own
        rows: ``ExternalBacking.write_back``)."""
        counters = (self.overflows, self.host_reads, self.host_writes)
        for counter, saved in zip(counters, undo.counters):
            counter.copy_(saved)
        self._staged = self._space_staged = None
        self._held = None
        if self.cache is not None:
            self._restore_cache(undo)

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

    def _locate(self, mask, keys, tids, size: int | None = None) -> _Located:
        """Where the backing tier holds the rows of the keys ``mask`` selects
        (``size`` of them, when known on the host)."""
        sub = sp.Subset(mask, size)
        k, (t,) = sub.keys(keys), sub.take(tids)
        found, src, offsets, scores = self.backing.locate(k, t)
        return _Located(sub, k, t, found, src, offsets, scores)

    def _write_back_victims(self, victims, loc: _Located) -> None:
        """Writes the cache rows of evicted keys back to the backing tier
        (their scores with them where both tiers keep the same), the keys
        ``loc`` found there protected from eviction until their rows are
        read."""
        if victims is None:
            return
        vk, vt, vs, vscores = victims
        protect = None
        if self._carry and loc.scores is not None:
            held = sp.Subset(loc.found)
            protect = (held.keys(loc.keys), *held.take(loc.tids, loc.scores))
        self.backing.write_back(
            vk,
            vt,
            self.cache.space(),
            self.cache.offsets(vs, vt),
            vscores if self._carry else None,
            protect=protect,
            expand=False,
        )

    def _carry_scores(self, slots, carried_mask, bscores, policies, vals) -> None:
        """The scores of keys the cache took from the backing tier
        (``carried_mask``, at cache ``slots``) continue the ones they had
        there."""
        fresh = self.cache.table.scores[slots.clamp(min=0)]
        carried = carry_scores(policies, vals, bscores, fresh)
        sp.scatter_rows(self.cache.table.scores, torch.where(carried_mask, slots, -1), carried)

    def _stage(self, keys, tids, loc: _Located, policies, vals, init, offsets, k, mask=None):
        """Stages the ``k`` keys the cache cannot take (``mask`` of the
        located subset ``loc``; all of them without a cache): their rows
        from the backing tier or new ones, in a
        staging buffer addressed after the cache's rows (the second segment
        of the row space), written back after the update; their entries of
        ``offsets`` point there."""
        if mask is None:
            pos = torch.arange(k, device=self.device)
        else:
            pos = torch.nonzero_static(mask, size=k).squeeze(1)
        at = loc.sub.origin(pos)
        skeys, stids = keys[at], tids[at]
        sfound, s_off = loc.found[pos], loc.offsets[pos]
        staged = sp.staging(k, self.layout, self.device)
        st_off = sp.staging_offsets(k, self.layout, self.device)
        sp.copy_rows(
            sp.as_space(staged),
            torch.where(sfound, st_off, -1),
            loc.src,
            s_off,
            self.layout.row_bytes_of(stids),
        )
        write_initial_rows(
            sp.as_space(staged), torch.where(sfound, -1, st_off), skeys, stids, init, self.layout
        )
        scores = None
        if self.backing.has_scores:  # then there is a cache, with the same scores
            v = vals[at] if isinstance(vals, torch.Tensor) and vals.shape[0] != 1 else vals
            scores = initial_scores(policies, v, k, self.cache.table.timer(), self.device)
            scores = torch.where(
                sfound.unsqueeze(1), carry_scores(policies, v, loc.scores[pos], scores), scores
            )
        before = (sfound, staged.clone()) if self._fallible else None
        self._staged = _Staged(staged, skeys, stids, scores, write_back=True, before=before)
        self.overflows += k
        offsets[at] = self._size0() + st_off

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
        self._held = None
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

    takes_padded_prefetch = True

    def prefetch(self, keys, tids, forward_stream=None) -> None:
        """Brings the keys of a coming batch that the backing tier holds into
        the cache, on the current stream, without reading anything on the
        host (with an evicting backing table that does not grow): after the
        last training lookup or update (an event recorded on the stream they
        ran on, which the pipeline's ``forward_stream`` need not be: it is
        not used), and before the next lookup (which waits for this one's
        event). ``keys`` may be padded (``PAD_KEY``)."""
        if self.cache is None or keys.numel() == 0:
            return
        cuda = self.device.type == "cuda"
        if not cuda:  # its table kernels refuse PAD_KEY
            keep = (keys != PAD_KEY).nonzero().squeeze(1)
            keys, tids = keys[keep], tids[keep]
        # Room in the backing tier for every key this can write back (only a
        # backing table that can grow needs it, and reads counts on the host).
        room = self.backing.room_for(tids, keys != PAD_KEY)
        if not cuda:
            if room is not None:
                self.backing.reserve(room)
        else:
            stream = torch.cuda.current_stream(self.device)
            if room is not None:
                # Made on the stream the training lookups run on: the
                # write-backs on this stream then never reallocate the backing
                # table (whose old blocks that stream's allocator would reuse
                # while this one still read them).
                with torch.cuda.stream(self._train_stream):
                    self.backing.reserve(room)
                stream.wait_stream(self._train_stream)
            stream.wait_event(self._train_event)
        cand = self.cache.table.find(keys, tids) < 0
        st = self._staged
        if st is not None:
            # Rows the batch in flight stages are stale in the backing tier.
            cand &= ~torch.isin(keys, st.keys)
        self._prefetch_into_cache(self._locate(cand, keys, tids))
        if cuda:
            self._prefetch_event = torch.cuda.Event()
            self._prefetch_event.record(torch.cuda.current_stream(self.device))

    def _prefetch_into_cache(self, loc: _Located) -> None:
        """Inserts the keys ``loc`` found in the backing tier into the cache
        and copies their rows in; the victims go back first, without evicting
        those rows."""
        cache = self.cache
        sub = sp.Subset(loc.found)
        fk, (ft, f_off) = sub.keys(loc.keys), sub.take(loc.tids, loc.offsets)
        if loc.scores is None or not self._carry:
            policies, vals = batch_policies(self.strategies, self._last_score, torch.zeros_like(fk))
            fscores = initial_scores(policies, vals, fk.numel(), cache.table.timer(), self.device)
        else:
            (fscores,) = sub.take(loc.scores)
        # The batch in flight holds its cache slots until its backward: they
        # go into the same call, which never evicts a slot it holds, with the
        # scores they have.
        held = 0
        all_keys, all_tids, all_scores = fk, ft, fscores
        if self._held is not None and self._held[0].numel():
            hk, ht, hs = self._held
            h = sp.Subset(hs >= 0)
            ht, hs = h.take(ht, hs)
            hk = h.keys(hk)
            held = hk.numel()
            all_keys = torch.cat([hk, fk])
            all_tids = torch.cat([ht, ft])
            all_scores = torch.cat([cache.table.scores[hs.clamp(min=0)], fscores])
        assign = [enums.ScorePolicy.ASSIGN] * cache.table.num_scores
        counters = self._counters() if self._fallible else None
        slots, status, evicted = cache.insert(all_keys, all_tids, assign, all_scores, expand=False)
        victims = self._victims(evicted)
        victim_rows = self._rows_at(victims) if self._fallible else None
        slots, status = slots[held:], status[held:]
        placed = (status == enums.InsertStatus.INSERTED) | (status == enums.InsertStatus.EVICTED)
        try:
            self._write_back_victims(victims, loc)
        except BaseException:
            if counters is not None:  # the cache as it was before this prefetch
                self.host_writes.copy_(counters[2])
                new = sp.Subset(placed)
                undo = _Undo(counters, (new.keys(fk), *new.take(ft)), victims, victim_rows)
                self._restore_cache(undo)
            raise
        self.prefetched += placed.sum()
        self.host_reads += placed.sum()
        sp.copy_rows(
            cache.space(),
            torch.where(placed, cache.offsets(slots, ft), -1),
            loc.src,
            f_off,
            self.layout.row_bytes_of(ft),
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

"""The staged steps of a ``CachedStorage`` (dynamicemb.storage.cache): over
a backing tier the kernels cannot address, an external ``Storage`` (with a
device cache or without), the keys a training lookup cannot place in the
cache are staged in the batch's overflow buffer (the second segment of the
row space) and written back after the update; a backing tier that
``can_fail`` is read before the cache changes, and a step keeps an ``Undo``
record until its rows are written back (docs/storage.md, "A storage that
raises").
"""

from dataclasses import dataclass

import torch
from torch.profiler import record_function

from dynamicemb.storage import space as sp
from dynamicemb.storage.rows import write_initial_rows
from dynamicemb.storage.scores import BatchScore, batch_policies, carry_scores, initial_scores
from dynamicemb.storage.types import RowInit
from dynamicemb.table import PAD_KEY, enums


def select_values(values, sub: "sp.Subset"):
    """The score values (``batch_policies``) of a subset of a batch's keys:
    a per-key tensor is restricted like them; a scalar, one row (the STEP
    score) or None stands for every key."""
    if isinstance(values, torch.Tensor) and values.shape[0] != 1:
        (values,) = sub.take(values)
    return values


@dataclass
class Located:
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


class Staged:
    """A batch's rows outside the cache: a staging buffer (the second
    segment of the row space) and what writing them back needs."""

    def __init__(self, buffer, keys, tids, scores, write_back: bool, before=None) -> None:
        self.buffer, self.keys, self.tids, self.scores = buffer, keys, tids, scores
        self.write_back = write_back
        # For a backing tier that can fail: (found (n) bool, a copy of the
        # rows before the update), what its write-back puts back on failure.
        self.before = before


@dataclass
class Undo:
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


class StagedSteps:
    """The staged training lookup, its undo record and the overflow buffer
    of a ``CachedStorage`` (whose attributes they use)."""

    def _train_staged(self, keys, tids, counts, score: BatchScore, init: RowInit) -> torch.Tensor:
        """The training lookup over a backing tier that stages (exact batches:
        ``takes_padded_batches`` is False)."""
        self._begin_step()
        self._last_score = score
        policies, vals = batch_policies(self.strategies, score, counts)
        self._staged = None
        undo = Undo(self._counters()) if self._fallible else None
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
            offsets = self.cache.offsets(slots, tids)
            miss = (status == enums.InsertStatus.INSERTED) | (status == enums.InsertStatus.EVICTED)
            over = status == enums.InsertStatus.FAILED
            need = miss | over
            if self.cache_observer is not None:
                self.cache_observer(status == enums.InsertStatus.FOUND, need, tids)
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
            self._fill_misses(loc, nmiss, ns, no, policies, vals, init)
            if n_over:
                staged = loc.sub.on & ~nmiss
                self._stage(keys, tids, loc, policies, vals, init, offsets, n_over, staged)
        self._space_staged = self._staged
        self._undo = undo
        self._record_train()
        return offsets

    def _counters(self) -> tuple[torch.Tensor, ...]:
        """Copies of the row counters, for ``Undo``."""
        return tuple(c.clone() for c in (self.overflows, self.host_reads, self.host_writes))

    def _rows_at(self, victims) -> torch.Tensor | None:
        """A staging copy of the cache rows of evicted keys (``_victims``),
        taken before their slots are refilled."""
        if victims is None:
            return None
        _, vt, vs, _ = victims
        return sp.stage_rows(self.cache.space(), self.cache.offsets(vs, vt), vt, self.layout)

    def _restore_cache(self, undo: Undo) -> None:
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

    def _roll_back(self, undo: Undo) -> None:
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

    def _stage(self, keys, tids, loc: Located, policies, vals, init, offsets, k, mask=None):
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
        self._staged = Staged(staged, skeys, stids, scores, write_back=True, before=before)
        self.overflows += k
        offsets[at] = self._size0() + st_off

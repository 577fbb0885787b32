"""The prefetch of a ``CachedStorage`` (dynamicemb.storage.cache): the keys
of a coming batch that the backing tier holds are brought into the cache
while the batch in flight trains, and, over a host table, room is made for
the keys stored nowhere (their buckets' victims go back to the backing tier
then), so that the coming batch's training lookup finds its rows in the
cache and evicts nothing: its lookup then moves nothing over the bus
(docs/storage.md, "caching=True").
"""

import torch
from torch.profiler import record_function

from dynamicemb.storage import space as sp
from dynamicemb.storage.cache_staging import Located, Undo
from dynamicemb.storage.scores import batch_policies, initial_scores
from dynamicemb.table import PAD_KEY, enums


def _member(keys: torch.Tensor, of: torch.Tensor) -> torch.Tensor:
    """(n) bool: ``keys[i]`` is one of ``of`` (a sorted copy searched:
    ``torch.isin`` reads on the host on a GPU)."""
    if of.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    s = torch.sort(of).values
    return s[torch.searchsorted(s, keys).clamp(max=s.numel() - 1)] == keys


class PrefetchSteps:
    """The prefetch of a ``CachedStorage`` (whose attributes it uses)."""

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
        if room is not None and self._overflow_in_backing():
            # Growing the backing table would move the rows the batch in
            # flight's update is still to write there: no prefetch this time
            # (the next forward finds or inserts every key itself).
            return
        self._before_prefetch(room)
        self._prefetch_rows(keys, tids)
        self._after_prefetch()

    def _overflow_in_backing(self) -> bool:
        """Whether the batch in flight has rows in the backing table that its
        update is still to write (reads a count on the host)."""
        return self._overflow is not None and bool((self._overflow[2] >= 0).any())

    def _prefetch_graph_state(self) -> tuple | None:
        """``graphs.prefetch_state``: what a CUDA graph of ``_prefetch_rows``
        would capture (the tiers' ``graphs.state`` and the tensors of the
        batch in flight it reads), or None when it may not be captured (a
        backing tier that stages, grows or may raise; the CPU)."""
        state = self._graph_state() if self.device.type == "cuda" else None
        if state is None:
            return None
        flight = tuple(
            None if x is None else tuple(t.data_ptr() for t in x)
            for x in (self._held, self._overflow)
        )
        # The last batch's score, which prefetched keys start from: a tensor
        # (a replayed lookup's step) by address, a number by value.
        score = tuple(
            x.data_ptr() if isinstance(x, torch.Tensor) else ("value", x)
            for x in (self._last_score.step, self._last_score.custom)
        )
        return (*state, flight, score)

    def _before_prefetch(self, room=None) -> None:
        """The host's part of a prefetch before its kernels (``_prefetch_rows``,
        eager or replayed from a CUDA graph: ``graphs.before_prefetch``): the
        backing tier's ``room`` reserved, the current stream after the last
        training lookup and the victims' rows on their way to the host
        table."""
        if self.device.type != "cuda":
            if room is not None:
                self.backing.reserve(room)
            self._wait_writes()
            return
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
        self._wait_writes()

    def _after_prefetch(self, writes=None) -> None:
        """The host's part of a prefetch after its kernels
        (``graphs.after_prefetch``, with the victims' rows a captured
        prefetch staged): the event the next lookup waits for, and the
        victims' rows sent to the host table."""
        if self.device.type == "cuda":
            self._prefetch_event = torch.cuda.Event()
            self._prefetch_event.record(torch.cuda.current_stream(self.device))
        self._submit_writes(writes)

    def _prefetch_rows(self, keys, tids) -> None:
        """A prefetch's kernels (``prefetch``, ``graphs.prefetch_rows``),
        reading nothing on the host on a GPU: ``keys`` may be padded there."""
        with record_function("dynamicemb:prefetch_find"):
            slots = self.cache.table.find(keys, tids)
            cand = slots < 0
            st = self._staged
            if st is not None:
                # Rows the batch in flight stages are stale in the backing tier.
                cand &= ~_member(keys, st.keys)
            if self._overflow is not None:
                # Rows its update is still to write in the backing tier.
                cand &= ~_member(keys, self._overflow[0])
            loc = self._locate(cand, keys, tids)
        self._prefetch_into_cache(loc, (keys, tids, slots))

    def _prefetch_into_cache(self, loc: Located, cached=None) -> None:
        """Inserts the keys ``loc`` found in the backing tier into the cache
        and copies their rows in; the victims go back first, without evicting
        those rows. Over a host table, the keys stored nowhere (new to the
        tables) go into the same call and are erased again at once: their
        buckets' victims are gone, and the slots they leave wait for those
        keys, which their batch then inserts without evicting anything.
        ``cached``: ``(keys, tids, slots)`` of the coming batch, slot -1
        where the cache does not hold the key: those it holds keep their
        slots."""
        with record_function("dynamicemb:prefetch_insert"):
            cache = self.cache
            sub = sp.Subset(loc.sub.on if self._direct else loc.found)
            fk, (ft, f_off, found) = sub.keys(loc.keys), sub.take(loc.tids, loc.offsets, loc.found)
            policies, vals = batch_policies(self.strategies, self._last_score, torch.zeros_like(fk))
            fscores = initial_scores(policies, vals, fk.numel(), cache.table.timer(), self.device)
            if loc.scores is not None and self._carry:
                (carried,) = sub.take(loc.scores)
                fscores = torch.where(found.unsqueeze(1), carried, fscores)
            # The batch in flight holds its cache slots until its backward, and
            # the coming batch's cached keys are to stay: the call holds their
            # slots (never evicts them; "Held slots", cc/table/operations.h).
            assign = [enums.ScorePolicy.ASSIGN] * cache.table.num_scores
            counters = self._counters() if self._fallible else None
            held = [k[2] for k in (self._held, cached) if k is not None]
            slots, status, evicted = cache.insert(
                fk, ft, assign, fscores, expand=False, held_slots=cache.table.slot_mask(*held)
            )
        with record_function("dynamicemb:prefetch_write_back"):
            victims = self._victims(evicted)
            victim_rows = self._rows_at(victims) if self._fallible else None
            placed = (status == enums.InsertStatus.INSERTED) | (
                status == enums.InsertStatus.EVICTED
            )
            try:
                self._write_back_victims(victims, loc, evicted)
            except BaseException:
                if counters is not None:  # the cache as it was before this prefetch
                    self.host_writes.copy_(counters[2])
                    new = sp.Subset(placed)
                    undo = Undo(counters, (new.keys(fk), *new.take(ft)), victims, victim_rows)
                    self._restore_cache(undo)
                raise
        with record_function("dynamicemb:prefetch_fill"):
            came = placed & found
            self.prefetched += came.sum()
            self.host_reads += came.sum()
            sp.copy_rows(
                cache.space(),
                torch.where(came, cache.offsets(slots, ft), -1),
                loc.src,
                f_off,
                self.layout.row_bytes_of(ft),
                by=self._host_side("src"),
            )
            if self._direct:
                room = sp.Subset(placed & ~found)
                cache.table.erase(room.keys(fk), *room.take(ft))

"""A scored hash table with its rows: the device, hybrid and host tables.

``HashTableStorage`` keeps the keys and metadata of its tables in one
``ScoredHashTable`` on the storage's device and their rows in a row space of
two segments: for each table, its first ``device_rows`` rows (slots, or
NO_EVICTION rows) in the device segment, the rest in the host segment. With a
budget of 0 every row is in host memory; with a budget of the table's bytes
every row is on the device; in between a key's hash decides its tier. It is
the storage of ``caching=False`` tables, and the backing table of a cache.

Expansion happens before an insert that could need it: an evicting table
doubles up to ``max_capacity`` when ``max_load_factor`` would be exceeded, a
NO_EVICTION table doubles its key map and rows without limit (see
docs/architecture.md). The row space is rebuilt for the new layout and every
stored key's row moves with it; the device part of a table grows up to its
budget, the rest is host memory.
"""

import warnings
from collections.abc import Callable, Iterator, Sequence

import torch

from dynamicemb.dynamicemb_config import (
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb.storage import padded
from dynamicemb.storage import space as sp
from dynamicemb.storage.hash_delta import HashDelta
from dynamicemb.storage.host_writes import HostWrites
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.placement import Placement, bucket_widths, initial_layout
from dynamicemb.storage.rows import rows_buffer, write_initial_rows
from dynamicemb.storage.scores import BatchScore, batch_policies, table_score_columns
from dynamicemb.storage.types import (
    REFUSED_ROW,
    ExportedRows,
    Footprint,
    HostBacking,
    RowInit,
    StepGraphs,
    TableStorage,
)
from dynamicemb.table import (
    ScoredHashTable,
    enums,
    first_valid_key,
    no_eviction_key_slots,
    ops,
)
from dynamicemb.types import MemoryType

S = DynamicEmbScoreStrategy

# Rehash attempts of one NO_EVICTION growth (each doubles the key map once more).
_MAX_REHASH = 16


def out_of_memory(e: BaseException) -> bool:
    msg = str(e)
    return (
        isinstance(e, torch.OutOfMemoryError)
        or "can't allocate memory" in msg
        or "out of memory" in msg
    )


class HashTableStorage(TableStorage, HashDelta, HostBacking):
    """The rows of fused tables in one scored hash table, each table's rows
    split between device and host memory by its budget: a ``TableStorage``
    whose last tier is itself (``DeltaRows``), and the ``HostBacking`` of a
    cache.

    Args:
        options (Sequence[DynamicEmbTableOptions]): one per table (``dim``,
            ``max_capacity`` and the score strategy set; the strategy is
            shared).
        layout (RowLayout): the row format.
        device (torch.device): where keys, metadata and device rows live.
        budgets (Sequence[int]): bytes of device memory for each table's rows.
        scorer_factory (Optional[Callable]): makes a victim scorer (the
            tables' ``score_function``) for this table; None without one.
        strategies (Optional[tuple]): the strategy to score keys by, when not
            the options' (a cache of NO_EVICTION tables caches by STEP).
        capacities (Optional[Sequence[int]]): fixed slots per table (a
            cache): no expansion, evicting.
        bucket_capacity (Optional[int]): bucket width for ``capacities``.
        retain_evicted (bool): record the keys this table evicts
            (``pop_evicted_keys``).
    """

    def __init__(
        self,
        options: Sequence[DynamicEmbTableOptions],
        layout: RowLayout,
        device: torch.device,
        budgets: Sequence[int],
        scorer_factory: Callable | None = None,
        strategies: tuple | None = None,
        capacities: Sequence[int] | None = None,
        bucket_capacities: Sequence[int | None] | None = None,
        retain_evicted: bool = False,
    ) -> None:
        self.options = list(options)
        self.layout = layout
        self.device = device
        self.budgets = [int(b) for b in budgets]
        self.strategies = strategies or self.options[0].score_strategies()
        self.no_eviction = S.NO_EVICTION in self.strategies
        self.retain_evicted = retain_evicted
        self._evicted: list[tuple[torch.Tensor, torch.Tensor]] = []
        if capacities is not None:  # a fixed-size table (a cache)
            self.table = ScoredHashTable(
                list(capacities),
                bucket_capacities=list(bucket_capacities),
                num_scores=len(self.strategies),
                device=device,
                validate=False,
            )
        elif self.no_eviction:
            caps, rows = initial_layout(self.options, True)
            self.table = ScoredHashTable(
                caps,
                bucket_capacities=bucket_widths(self.options),
                num_scores=1,
                no_eviction=True,
                max_capacities=caps,
                row_capacities=rows,
                device=device,
                validate=False,
            )
        else:
            caps, _ = initial_layout(self.options, False)
            self.table = ScoredHashTable(
                caps,
                bucket_capacities=bucket_widths(self.options),
                num_scores=len(self.strategies),
                max_capacities=[int(o.max_capacity) for o in self.options],
                max_load_factor=self.options[0].max_load_factor,
                device=device,
                validate=False,
            )
        self._scorer = None if scorer_factory is None else scorer_factory()
        self._first_valid = first_valid_key()
        # Training inserts refuse new keys colder than their full bucket's
        # lowest (DynamicEmbTableOptions.refuse_cold_keys); a cache never does.
        self.refuse_cold = capacities is None and self.options[0].refuse_cold_keys
        # Plain ints: torch.compile compares tensors with ints, not enum members.
        self._found = int(enums.InsertStatus.FOUND)
        self._refused = int(enums.InsertStatus.REFUSED)
        # Keys a write-back could not place (their bucket full of its own keys).
        self.dropped = torch.zeros((), dtype=torch.int64, device=device)
        # Rows written into this table's host rows off the step's stream (a
        # cache's victims: ``write_back(staged=True)``).
        self.writes = HostWrites(layout, device)
        self.graphs = StepGraphs(state=self._graph_state)
        self._place(self._rows())

    # ------------------------------------------------------------- layout --

    def _rows(self) -> list[int]:
        t = self.table
        if self.no_eviction:
            return [t.row_capacity(i) for i in range(t.num_tables)]
        return [t.capacity(i) for i in range(t.num_tables)]

    def _place(self, rows: Sequence[int]) -> None:
        """Allocates the row space for ``rows`` rows per table (raises when
        out of memory, changing nothing)."""
        nbytes = sum(r * rb for r, rb in zip(rows, self.layout.row_bytes))
        if nbytes >= 2**62:
            raise ValueError(
                f"dynamicemb: value rows of {list(rows)} rows per table (the capacities) x "
                f"{list(self.layout.row_bytes)} bytes (dim and optimizer state) need {nbytes} "
                "bytes, more than a tensor can address"
            )
        placement = Placement.of(rows, self.layout, self.budgets, self.device)
        seg0 = sp.allocate(placement.size0, MemoryType.DEVICE, self.device)
        seg1 = sp.allocate(placement.size1, MemoryType.HOST, self.device)
        self._set_placement(placement, sp.RowSpace(seg0, seg1))

    def _set_placement(self, placement: "Placement", rows_space: sp.RowSpace) -> None:
        self.placement, self.rows_space = placement, rows_space
        self._slot_offsets = torch.tensor(
            [self.table.slot_range(t)[0] for t in range(self.table.num_tables)],
            dtype=torch.int64,
            device=self.device,
        )
        # Evicting tables of one row width in one segment: a slot's row is at
        # slot * row_bytes (the tables' slots and rows are both back to back).
        widths = set(self.layout.row_bytes)
        self._slot_stride = (
            self.layout.row_bytes[0]
            if not self.no_eviction and len(widths) == 1 and placement.one_tier()
            else None
        )

    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows_space.tensors

    def local_rows(self, slots: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Each slot's row within its table (-1 stays -1)."""
        if self.no_eviction:
            return self.table.rows(slots)
        return torch.where(slots >= 0, slots - self._slot_offsets[tids], slots)

    def offsets(self, slots: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Byte offsets in ``space()`` of the rows of table slots (-1 stays -1)."""
        if self._slot_stride is not None:
            # Slots are -1 or >= 0: -stride clamps back to -1 (two kernels, not three).
            return (slots * self._slot_stride).clamp_(min=-1)
        return self.placement.offsets(self.local_rows(slots, tids), tids)

    def _move_rows(self, old: "Placement", old_space, old_off: torch.Tensor, tids, new_local):
        """After a relayout: copies rows from the old row space to the new
        (after the rows on their way into the old one)."""
        self.writes.wait()
        new_off = self.placement.offsets(new_local, tids)
        sp.copy_rows(
            self.rows_space.tensors,
            new_off,
            old_space.tensors,
            old_off,
            self.layout.row_bytes_of(tids),
        )

    # ---------------------------------------------------------- expansion --

    def reserve(self, incoming: Sequence[int]) -> None:
        """Expands the evicting tables that ``incoming[t]`` new keys could take
        above ``max_load_factor`` (up to ``max_capacity``), moving rows."""
        if self.no_eviction:
            sizes = [int(x) for x in self.table.size().tolist()]
            needed = [s + int(i) for s, i in zip(sizes, incoming)]
            grow = [
                t
                for t in range(self.table.num_tables)
                if needed[t] > self.table.row_capacity(t)
                or no_eviction_key_slots(needed[t]) > self.table.capacity(t)
            ]
            if grow:
                self._grow(grow, needed)
            return
        state = self.table.state()
        old_placement, old_space = self.placement, self.rows_space
        old_slot_offsets = self._slot_offsets
        moved = self.table.reserve(list(incoming))
        if moved is None:
            return
        old_slots, new_slots = moved
        tids = torch.searchsorted(old_slot_offsets, old_slots, right=True) - 1
        old_off = old_placement.offsets(old_slots - old_slot_offsets[tids], tids)
        try:
            self._place(self._rows())
        except BaseException:
            self.table.restore(state)
            self._set_placement(old_placement, old_space)
            raise
        self._move_rows(
            old_placement, old_space, old_off, tids, new_slots - self._slot_offsets[tids]
        )

    def _grow(self, tables: Sequence[int], needed: Sequence[int] | None = None) -> bool:
        """NO_EVICTION: doubles the key map and the rows of ``tables``
        (repeatedly, until ``needed[t]`` keys fit at ``NO_EVICTION_LOAD_FACTOR``; at
        least once).
        A key map that cannot place every key at its new capacity is doubled
        again. Out of memory: warns, changes nothing and returns False."""
        n = self.table.num_tables
        caps = [self.table.capacity(t) for t in range(n)]
        rows = [self.table.row_capacity(t) for t in range(n)]
        old_rows = list(rows)
        for t in tables:
            want = rows[t] + 1 if needed is None else int(needed[t])
            while want > rows[t] or no_eviction_key_slots(want) > caps[t]:
                caps[t], rows[t] = caps[t] * 2, rows[t] * 2
        old_placement, old_space = self.placement, self.rows_space
        try:
            new_placement = Placement.of(rows, self.layout, self.budgets, self.device)
            seg0 = sp.allocate(new_placement.size0, MemoryType.DEVICE, self.device)
            seg1 = sp.allocate(new_placement.size1, MemoryType.HOST, self.device)
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            self._warn_oom(tables, caps, rows, e)
            return False
        for _ in range(_MAX_REHASH):
            try:
                self.table.relayout(caps, rows)
                break
            except RuntimeError as e:
                if out_of_memory(e):
                    self._warn_oom(tables, caps, rows, e)
                    return False
                if "relayout could not place" not in str(e):
                    raise
                # A bucket overflowed at the new capacity: double the key map again.
                for t in tables:
                    caps[t] *= 2
        else:
            raise RuntimeError(
                f"dynamicemb: NO_EVICTION tables {list(tables)} could not be rehashed"
            )
        self._set_placement(new_placement, sp.RowSpace(seg0, seg1))
        # Rows keep their numbers: table t's rows [0, old_rows[t]) move as they are.
        tids = torch.repeat_interleave(
            torch.arange(n, device=self.device),
            torch.tensor(old_rows, device=self.device),
        )
        starts = torch.tensor([0] + old_rows[:-1], device=self.device).cumsum(0)
        local = torch.arange(tids.numel(), device=self.device) - starts[tids]
        old_off = old_placement.offsets(local, tids)
        self._move_rows(old_placement, old_space, old_off, tids, local)
        return True

    def _warn_oom(self, tables, caps, rows, e) -> None:
        warnings.warn(
            f"dynamicemb: NO_EVICTION tables {list(tables)} cannot grow to key map "
            f"capacities {[caps[t] for t in tables]} and {[rows[t] for t in tables]} "
            f"rows: out of memory ({e}). Training continues; keys that do not fit "
            "are not stored and read zeros.",
            stacklevel=4,
        )

    def _expand_for(self, keys: torch.Tensor, tids: torch.Tensor) -> None:
        """Expands the tables the keys they do not hold yet could overfill
        (``reserve``). Only a table that can still grow pays for counting them
        (a find and a read of the counts)."""
        t = self.table
        if not self.no_eviction and self._at_capacity():
            return
        # Reserved keys (a padded batch's padding) are never stored.
        new = (t.find(keys, tids) < 0) & (keys >= self._first_valid)
        self.reserve(torch.bincount(tids[new], minlength=t.num_tables).tolist())

    def _at_capacity(self) -> bool:
        """Every table at its max_capacity (an evicting one no longer grows)."""
        t = self.table
        return all(t.capacity(i) >= t.max_capacity(i) for i in range(t.num_tables))

    # ------------------------------------------------------------ inserts --

    def insert(
        self,
        keys: torch.Tensor,
        tids: torch.Tensor,
        policies=None,
        values=None,
        evict: bool = True,
        expand: bool = True,
        train: bool = False,
        held_slots: torch.Tensor | None = None,
    ):
        """Find-or-insert (expanding first when ``expand``), evicting from full
        buckets when ``evict`` (NO_EVICTION tables never evict: they grow).
        A training insert (``train``) refuses, with ``refuse_cold``, the new
        keys colder than their full bucket's lowest (status REFUSED).
        ``held_slots``: a (num_slots) bool mask of slots the eviction leaves
        alone (``ScoredHashTable.insert_and_evict``).

        Returns:
            (slots, status, evicted): per key its slot (-1: not stored) and
            ``InsertStatus``, and the ``EvictedKeys`` (None when nothing can be
            evicted). Keys evicted from a table that retains them are
            recorded for ``pop_evicted_keys``.
        """
        if expand:
            self._expand_for(keys, tids)
        if self.no_eviction:
            return (*self._insert_no_eviction(keys, tids), None)
        if not evict:
            res = self.table.insert(keys, tids, policies=policies, scores=values)
            return res.slots, res.status, None
        victim = None if self._scorer is None else self._scorer(self.table, keys, tids)
        refuse = train and self.refuse_cold
        res = self.table.insert_and_evict(
            keys,
            tids,
            policies=policies,
            scores=values,
            victim_scores=victim,
            refuse_cold=refuse,
            held_slots=held_slots,
        )
        if self.retain_evicted:
            self.record_evicted(res.evicted.compact())
        return res.slots, res.status, res.evicted

    def record_evicted(self, evicted) -> None:
        """Keeps evicted keys (compacted ``EvictedKeys``) for ``pop_evicted_keys``."""
        if evicted.keys.numel():
            self._evicted.append((evicted.keys, evicted.table_ids))

    def _insert_no_eviction(self, keys, tids):
        """NO_EVICTION find-or-insert: a key whose bucket was full grows its
        table and is placed again, so that every key is stored while memory
        lasts."""
        res = self.table.insert(keys, tids)
        slots, status = res.slots, res.status
        for _ in range(_MAX_REHASH):
            failed = status == enums.InsertStatus.FAILED
            if not bool(failed.any()):
                break
            # A full bucket below NO_EVICTION_LOAD_FACTOR: double the tables it happened in
            # and place the keys again.
            if not self._grow(torch.unique(tids[failed]).tolist()):
                break
            idx = failed.nonzero().squeeze(1)
            again = self.table.insert(keys[idx], tids[idx])
            slots = slots.index_copy(0, idx, again.slots)
            status = status.index_copy(0, idx, again.status)
        return slots, status

    def write_new_rows(
        self, offsets: torch.Tensor, keys: torch.Tensor, tids: torch.Tensor, init: RowInit
    ) -> None:
        """Writes the initial rows of new keys at ``offsets`` of this storage
        (entries at -1 skipped)."""
        write_initial_rows(self.rows_space.tensors, offsets, keys, tids, init, self.layout)

    takes_padded_batches = True

    def _graph_state(self) -> tuple | None:
        """``graphs.state``: evicting tables at their capacity, without a victim scorer or
        evicted keys to record: their training step neither synchronizes nor
        moves a tensor (the state's addresses change only when the table
        or its rows are rebuilt: an expansion, a relayout, a restore)."""
        t = self.table
        if self.no_eviction or self._scorer is not None or self.retain_evicted:
            return None
        if not self._at_capacity():
            return None
        tensors = (
            *_table_tensors(t),
            self._slot_offsets,
            self.placement.params,
            *self.rows_space.tensors,
        )
        return (*(x.data_ptr() for x in tensors), t.total_buckets, self._slot_stride)

    def key_table(self) -> ScoredHashTable:
        return self.table

    @property
    def hash_table(self) -> ScoredHashTable:
        return self.table

    def train_rows(
        self, keys, tids, counts, score: BatchScore, init: RowInit, num_keys=None, lookup=None
    ) -> torch.Tensor:
        return padded.train_padded(
            self._train_rows, keys, tids, counts, score, init, num_keys, lookup
        )

    def _train_rows(self, keys, tids, counts, score: BatchScore, init: RowInit) -> torch.Tensor:
        return self.insert_rows(keys, tids, counts, score, init)[1]

    def insert_rows(
        self, keys, tids, counts, score: BatchScore, init: RowInit, expand: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training find-or-insert by the table's own score strategy, new
        keys' rows written: ``(slots, offsets)``, -1 where not stored."""
        policies, vals = batch_policies(self.strategies, score, counts)
        slots, status, _ = self.insert(keys, tids, policies, vals, expand=expand, train=True)
        # Every entry goes to the writer, all but the new keys at -1: no
        # selection of the new keys, whose number only the device knows.
        if self._slot_stride is not None:  # both in one pass
            offsets, new = ops().slot_rows(slots, status, self._slot_stride, self._found)
        else:
            offsets = self.offsets(slots, tids)
            new = torch.where(self._new(status), offsets, -1)
        self.write_new_rows(new, keys, tids, init)
        return slots, self.mark_refused(offsets, status)

    def mark_refused(self, rows: torch.Tensor, status: torch.Tensor) -> torch.Tensor:
        """``rows`` with ``REFUSED_ROW`` where a training insert refused a
        key (see ``train_rows``); as they are without ``refuse_cold``."""
        if not self.refuse_cold:
            return rows
        return torch.where(status == self._refused, REFUSED_ROW, rows)

    def _new(self, status: torch.Tensor) -> torch.Tensor:
        """(n) bool of an insert's statuses: the entries whose rows are new
        (inserted, or in an evicted key's slot), one comparison: every entry
        not found. An entry not stored is True as well; its offset is -1,
        which the row writers skip."""
        return status != self._found

    def eval_rows(self, keys, tids) -> torch.Tensor:
        return self.offsets(self.table.find(keys, tids), tids)

    def contains(self, keys, tids) -> torch.Tensor:
        return self.table.find(keys, tids) >= 0

    def after_update(self) -> None:
        """Nothing to write back: the kernels update the rows where they are."""

    def prefetch(self, keys, tids, forward_stream=None) -> None:
        """Nothing to prefetch: every row is in this table's row space."""

    def flush(self) -> None:
        """No cache to flush."""

    def purge(self) -> None:
        """No cache to empty."""

    # ------------------------------------------------------- row transfers --

    def read(self, slots: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(n, max_row_bytes) staging rows of table slots (zeros where -1)."""
        return sp.stage_rows(self.rows_space.tensors, self.offsets(slots, tids), tids, self.layout)

    def write(self, slots: torch.Tensor, tids: torch.Tensor, src, src_offsets) -> None:
        """Copies rows from ``src`` (a row space) at ``src_offsets`` into table
        slots (-1 skipped), in address order where rows are in host memory."""
        host = self.rows_space.bytes_in(MemoryType.HOST) > 0
        sp.copy_rows(
            self.rows_space.tensors,
            self.offsets(slots, tids),
            src,
            src_offsets,
            self.layout.row_bytes_of(tids),
            by="dst" if host else None,
        )

    # ------------------------------------------------------ backing a cache --

    @property
    def has_scores(self) -> bool:
        """Whether keys carry scores between this table and a cache."""
        return not self.no_eviction

    def locate(self, keys: torch.Tensor, tids: torch.Tensor):
        """Where the rows of keys this table holds are, for a cache to copy
        them from: ``(found (n) bool, the row space, (n) byte offsets (-1
        where not held), scores (n, num_scores) or None)``. The offsets hold
        until the table changes (``expand_for`` first, when rows go back in
        after)."""
        slots = self.table.find(keys, tids)
        scores = None if self.no_eviction else self.scores_at(slots)
        return slots >= 0, self.rows_space.tensors, self.offsets(slots, tids), scores

    def scores_at(self, slots: torch.Tensor) -> torch.Tensor:
        return self.table.scores[slots.clamp(min=0)]

    def fetch(self, keys: torch.Tensor, tids: torch.Tensor):
        """The rows of keys this table holds, copied: ``(found (n) bool,
        staging rows (n, max_row_bytes), scores (n, num_scores) or None)``."""
        found, space, offsets, scores = self.locate(keys, tids)
        return found, sp.stage_rows(space, offsets, tids, self.layout), scores

    def room_for(self, tids: torch.Tensor, valid: torch.Tensor | None = None) -> list[int] | None:
        """Keys per table to ``reserve`` for one more key per entry of ``tids``
        (its table; with ``valid``, per entry it marks), read to the host;
        None when no table can grow (then nothing is read)."""
        t = self.table
        if self.no_eviction or any(t.capacity(i) < t.max_capacity(i) for i in range(t.num_tables)):
            ones = torch.ones_like(tids) if valid is None else valid.to(torch.int64)
            counts = torch.zeros(t.num_tables, dtype=torch.int64, device=tids.device)
            return counts.index_add_(0, tids, ones).tolist()
        return None

    def expand_for(self, keys: torch.Tensor, tids: torch.Tensor) -> None:
        """Expands the tables that ``keys`` (those not held yet) could
        overfill, before a ``write_back`` of them with ``expand=False``."""
        self._expand_for(keys, tids)

    def write_back(
        self,
        keys,
        tids,
        src,
        src_offsets,
        scores,
        protect=None,
        expand: bool = True,
        before=None,
        staged: bool = False,
        count=None,
    ) -> None:
        """Stores rows a cache gives back (from the row space ``src``), with
        their scores (``ASSIGN``; None under NO_EVICTION). The table expands
        first for the keys it does not hold (unless ``expand`` is False: the
        caller did, with ``expand_for``); a full bucket evicts (the last tier:
        recorded under RETAIN_KEY); a key it cannot place at all is dropped and
        counted in ``dropped``. Entries of ``PAD_KEY`` are left out.

        ``protect``: ``(keys, table ids, scores)`` of keys a ``locate`` found
        whose rows are still to be read: the call holds their slots
        (``held_slots``, found again by one find), so that no key written back
        evicts them; their scores stay as they are.
        ``before`` does not apply: the table cannot fail midway.

        ``staged``: the rows go through ``writes`` (gathered now into device
        memory, written to their host rows on a side stream; ``count``: ()
        int64, the entries with a row, a valid prefix), so that the rows of
        ``src`` may be reused at once; otherwise they are copied now."""
        if keys.numel() == 0:
            return
        if expand:
            self._expand_for(keys, tids)
        if self.no_eviction:  # never evicts: nothing to protect
            slots, status, _ = self.insert(keys, tids, expand=False)
        else:
            held = None
            if protect is not None:
                held = self.table.slot_mask(self.table.find(protect[0], protect[1]))
            assign = [enums.ScorePolicy.ASSIGN] * self.table.num_scores
            slots, status, _ = self.insert(
                keys, tids, assign, scores, expand=False, held_slots=held
            )
        self.dropped += (status == enums.InsertStatus.FAILED).sum()
        if not staged:
            self.write(slots, tids, src, src_offsets)
            return
        self.writes.stage(
            self.rows_space.tensors,
            self.offsets(slots, tids),
            src,
            src_offsets,
            self.layout.row_bytes_of(tids),
            keys=keys,
            slots=slots,
            count=count,
        )

    def drop_moved_writes(self) -> None:
        """Drops the staged rows whose slot another key took since
        (``HostWrites.drop_moved``)."""
        self.writes.drop_moved(self.table.keys)

    # -------------------------------------------------------- checkpoints --

    def score_columns(self) -> list[int] | None:
        """For each score column in ``score_strategy`` tuple order, the table
        word holding it; None under NO_EVICTION."""
        return None if self.no_eviction else table_score_columns(self.strategies)

    def export_rows(self, table: int, chunk: int) -> Iterator[ExportedRows]:
        lo, hi = self.table.slot_range(table)
        cols = self.score_columns()
        for begin in range(lo, hi, chunk):
            ex = self.table.export_batch(begin, min(begin + chunk, hi)).compact()
            yield self.rows_of(ex.keys, ex.slots, ex.table_ids, ex.scores, table, cols)

    def rows_of(self, keys, slots, tids, scores, table: int, cols) -> ExportedRows:
        emb, state = sp.unpack_rows(self.read(slots, tids), tids, self.layout, False)
        width, sd = self.layout.embedding_columns(table), self.layout.state_dims[table]
        return ExportedRows(
            keys=keys,
            scores=None if cols is None else scores[:, cols],
            embeddings=emb[:, :width],
            optimizer_state=state[:, :sd] if sd else None,
        )

    def import_rows(self, table, keys, scores, embeddings, optimizer_state, init) -> torch.Tensor:
        keys = keys.to(self.device)
        tids = torch.full_like(keys, table)
        if self.no_eviction:
            slots, _ = self._insert_no_eviction(keys, tids)
        else:
            internal = torch.empty_like(scores)
            internal[:, self.score_columns()] = scores
            assign = [enums.ScorePolicy.ASSIGN] * self.table.num_scores
            slots = self.table.insert(
                keys, tids, policies=assign, scores=internal.to(self.device)
            ).slots
        stored = slots >= 0
        idx = stored.nonzero().squeeze(1)
        buf = rows_buffer(keys[idx], tids[idx], embeddings, optimizer_state, idx, init, self.layout)
        self.write(
            slots[idx],
            tids[idx],
            sp.as_space(buf),
            sp.staging_offsets(idx.numel(), self.layout, self.device),
        )
        return stored

    def clear_tables(self, tables: Sequence[int]) -> None:
        for t in tables:
            lo, hi = self.table.slot_range(t)
            ex = self.table.export_batch(lo, hi).compact()
            if ex.keys.numel():
                self.table.erase(ex.keys, ex.table_ids)

    def reserve_rows(self, table: int, incoming: int) -> None:
        counts = [0] * self.table.num_tables
        counts[table] = int(incoming)
        self.reserve(counts)

    def snapshot(self) -> dict:
        t = self.table
        holds_keys = bool((t.size() > 0).any())
        segs = (self.rows_space.seg0, self.rows_space.seg1)
        return {
            "table": t.state(copy=True),
            "placement": self.placement.snapshot(),
            "rows_space": self.rows_space,
            # Rows mean nothing in an empty table.
            "rows": [s.data.to("cpu", copy=True) for s in segs] if holds_keys else None,
            "evicted": list(self._evicted),
            "dropped": self.dropped.clone(),
        }

    def restore(self, snapshot: dict) -> None:
        self.writes.wait()
        self.table.restore(snapshot["table"])
        self._set_placement(snapshot["placement"].snapshot(), snapshot["rows_space"])
        if snapshot["rows"] is not None:
            for seg, saved in zip((self.rows_space.seg0, self.rows_space.seg1), snapshot["rows"]):
                seg.data.copy_(saved)
        self._evicted = snapshot["evicted"]
        self.dropped = snapshot["dropped"]

    # ---------------------------------------------------------- accounting --

    def metadata_bytes(self) -> int:
        t = self.table
        tables = sum(x.numel() * x.element_size() for x in _table_tensors(t))
        return tables + sum(self.placement.remap_bytes())

    def footprint_per_table(self) -> list[Footprint]:
        t, p = self.table, self.placement
        # A table's slots and free rows, and its row of table info and counters.
        own = (t.info.shape[1] * t.info.element_size()) + (
            t.counters.shape[1] * t.counters.element_size()
        )
        return [
            Footprint(device=meta + own + remap + d * rb, host=(r - d) * rb)
            for meta, d, r, rb, remap in zip(
                t.memory_per_table(),
                p.dev_rows,
                p.rows,
                self.layout.row_bytes,
                p.remap_bytes(),
            )
        ]

    def footprint(self) -> Footprint:
        s = self.rows_space
        return Footprint(
            device=self.metadata_bytes() + s.seg0.nbytes,
            host=s.seg1.nbytes,
        )

    def sizes(self) -> list[int]:
        return [int(x) for x in self.table.size().tolist()]

    def capacity(self, table: int) -> int:
        return self.table.capacity(table)

    def limit(self, table: int) -> int:
        t = self.table
        return t.row_capacity(table) if t.is_no_eviction(table) else t.capacity(table)

    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        if self._evicted:
            keys = torch.cat([k for k, _ in self._evicted])
            tids = torch.cat([t for _, t in self._evicted])
        else:
            keys = tids = torch.empty(0, dtype=torch.int64, device=self.device)
        chosen = set(range(self.table.num_tables) if tables is None else tables)
        popped = torch.tensor(sorted(chosen), dtype=torch.int64, device=self.device)
        kept = ~torch.isin(tids, popped)
        self._evicted = [(keys[kept], tids[kept])] if bool(kept.any()) else []
        return [
            torch.unique(keys[tids == t]) if t in chosen else keys[:0]
            for t in range(self.table.num_tables)
        ]


def _table_tensors(t: ScoredHashTable) -> tuple[torch.Tensor, ...]:
    """A scored hash table's state tensors (its slots, table info, counters
    and free rows)."""
    return (t.keys, t.digests, t.scores, t.info, t.counters, t.free_rows)

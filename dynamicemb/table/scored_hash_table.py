"""The scored hash table: many logical tables of int64 keys in one allocation.

This class owns the table's tensors and calls the ``torch.ops.dynamicemb``
kernels (CPU or CUDA, by the table's device). It maps keys to slots and keeps
per-slot scores; values (embeddings, optimizer state) live in the layer above,
indexed by slot, or, under NO_EVICTION, by the row held in score word 0.
The semantics are documented once, in ``cc/table/`` (``layout.h``, ``hash.h``,
``scores.h``, ``operations.h``, ``rows.h``).
"""

from collections.abc import Sequence

import torch

from dynamicemb._checks import as_int, as_real, as_tensor, device_of
from dynamicemb.table._args import (
    INT64_MIN,
    IntOrSeq,
    ScoreValues,
    _flag,
    _ints,
    _optional_ints,
    _per_slot,
    _per_table,
    _score_values,
)
from dynamicemb.table._native import constants, enums, ops
from dynamicemb.table.keys import check_keys, first_repeat
from dynamicemb.table.results import EvictedKeys, ExportedBatch, InsertResult
from dynamicemb.table.sizes import (
    DIGEST_DTYPE,
    FREE_ROW_DTYPE,
    KEY_DTYPE,
    NO_EVICTION_LOAD_FACTOR,
    SCORE_DTYPE,
    TABLE_CELL_DTYPE,
    state_bytes,
)


class ScoredHashTable:
    """Fused scored hash tables, on CPU or CUDA.

    Args:
        capacities (Sequence[int]): initial slots of each logical table.
        bucket_capacities (int or Sequence[int]): slots per bucket, a multiple of
            16 dividing the capacity; ``None`` for one bucket spanning the table.
        num_scores (int): score words per slot: 1, or 2 for TIMESTAMP+LFU.
        no_eviction (bool or Sequence[bool]): NO_EVICTION tables never evict;
            score word 0 is the key's row in the value buffer.
        max_capacities (int or Sequence[int], optional): expansion limit per
            table (defaults to the initial capacity: no expansion).
        row_capacities (int or Sequence[int], optional): NO_EVICTION value rows
            (defaults to the capacity).
        max_load_factor (float): expansion happens before an insert that could
            take a table above this load.
        device (torch.device, optional): where the table lives.
        validate (bool): check key values and table ids of every call (on CUDA
            this synchronizes; the CPU kernels always check).

    Example::

        t = ScoredHashTable([1024], bucket_capacities=128)
        res = t.insert_and_evict(torch.tensor([7, 8, 9]), scores=torch.tensor([[5]]))
        slots = t.find(torch.tensor([8, 10]))   # [slot of 8, -1]
    """

    def __init__(
        self,
        capacities: Sequence[int],
        bucket_capacities: int | None | Sequence[int | None] = 128,
        num_scores: int = 1,
        no_eviction: bool | Sequence[bool] = False,
        max_capacities: IntOrSeq | None = None,
        row_capacities: IntOrSeq | None = None,
        max_load_factor: float = 0.5,
        device: str | torch.device | None = None,
        validate: bool = True,
    ) -> None:
        c = constants()
        self._align = int(c["BUCKET_ALIGNMENT"])
        capacities = _ints(capacities, "capacities")
        n = len(capacities)
        if n == 0:
            raise ValueError("ScoredHashTable needs at least one table")
        num_scores = as_int(num_scores, "num_scores")
        if not 1 <= num_scores <= int(c["MAX_SCORES"]):
            raise ValueError(f"num_scores must be 1..{c['MAX_SCORES']}, got {num_scores}")
        max_load_factor = as_real(max_load_factor, "max_load_factor")
        if not 0.0 < max_load_factor <= 1.0:
            raise ValueError(f"max_load_factor must be in (0, 1], got {max_load_factor}")
        widths = _optional_ints(bucket_capacities, n, "bucket_capacities", min=1)
        self._one_bucket = [w is None for w in widths]
        for t, (cap, w) in enumerate(zip(capacities, widths)):
            self._check_layout(t, cap, cap if w is None else w)
        widths = [cap if w is None else w for cap, w in zip(capacities, widths)]
        flags = _per_table(no_eviction, n, "no_eviction")
        for x in flags:
            if not isinstance(x, bool):
                raise TypeError(f"no_eviction must be a bool or one bool per table, got {x!r}")
        self._no_eviction = list(flags)
        max_caps = _optional_ints(max_capacities, n, "max_capacities", min=1)
        self._max_caps = [cap if m is None else m for cap, m in zip(capacities, max_caps)]
        for t, (cap, m, w) in enumerate(zip(capacities, self._max_caps, widths)):
            if m < cap:
                raise ValueError(f"table {t}: max_capacity {m} is below its capacity {cap}")
            # Growth doubles up to the max capacity, which must be a layout too:
            # whole buckets, or one bucket of a multiple of 16.
            unit = self._align if self._one_bucket[t] else w
            if m % unit:
                what = f"{unit} (one bucket)" if self._one_bucket[t] else f"the bucket capacity {w}"
                raise ValueError(f"table {t}: max_capacity {m} is not a multiple of {what}")
        rows = _optional_ints(row_capacities, n, "row_capacities", min=0)
        rows = [
            (cap if r is None else r) if ne else 0
            for cap, r, ne in zip(capacities, rows, self._no_eviction)
        ]
        if not isinstance(validate, bool):
            raise TypeError(f"validate must be a bool, got {validate!r}")
        self.num_scores = num_scores
        # Read once here: a training step torch.compile traces checks against it.
        self._policy_values = frozenset(int(m) for m in enums.ScorePolicy)
        self.max_load_factor = max_load_factor
        self.validate = validate
        self.device = device_of(device if device is not None else "cpu")
        if self.device.type == "meta":
            raise ValueError("device must hold data: a table cannot live on the meta device")
        self.has_rows = any(self._no_eviction)
        self._capacities = capacities
        self._widths = widths
        self._row_caps = rows
        self.counters = torch.zeros(
            (n, int(c["COUNTER_COLS"])), dtype=TABLE_CELL_DTYPE, device=self.device
        )
        self._erased: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._allocate(capacities, widths, rows)

    # ------------------------------------------------------------ layout --

    def _check_layout(self, table: int, capacity: int, width: int) -> None:
        a = self._align
        if width <= 0 or width % a:
            raise ValueError(
                f"table {table}: bucket capacity {width} is not a positive multiple of {a}"
            )
        if capacity <= 0 or capacity % width:
            raise ValueError(
                f"table {table}: capacity {capacity} is not a positive multiple of the "
                f"bucket capacity {width}"
            )

    def _info_rows(self, caps: list[int], widths: list[int], rows: list[int]) -> torch.Tensor:
        c = constants()
        col = enums.InfoCol
        info = torch.zeros((len(caps), int(c["INFO_COLS"])), dtype=TABLE_CELL_DTYPE)
        slot = bucket = row = 0
        for t, (cap, w, r) in enumerate(zip(caps, widths, rows)):
            info[t, col.SLOT_OFFSET] = slot
            info[t, col.CAPACITY] = cap
            info[t, col.BUCKET_CAPACITY] = w
            info[t, col.BUCKET_OFFSET] = bucket
            info[t, col.ROW_OFFSET] = row
            info[t, col.ROW_CAPACITY] = r
            info[t, col.MODE] = (
                enums.TableMode.NO_EVICTION if self._no_eviction[t] else enums.TableMode.EVICTING
            )
            slot += cap
            bucket += cap // w
            row += r
        return info

    def _allocate(self, caps: list[int], widths: list[int], rows: list[int]) -> None:
        c = constants()
        total = sum(caps)
        nbytes = state_bytes(caps, self.num_scores, sum(rows))
        if nbytes >= 2**63:
            raise ValueError(
                f"dynamicemb: capacities {caps} (bucket capacities {widths}) and row_capacities "
                f"{rows} need {nbytes} bytes, more than a tensor can address"
            )
        self.info_host = self._info_rows(caps, widths, rows)
        self.info = self.info_host.to(self.device)
        try:
            keys = torch.full((total,), int(c["EMPTY_KEY"]), dtype=KEY_DTYPE, device=self.device)
            digests = torch.full(
                (total,), int(c["EMPTY_DIGEST"]), dtype=DIGEST_DTYPE, device=self.device
            )
            scores = torch.zeros((total, self.num_scores), dtype=SCORE_DTYPE, device=self.device)
            free_rows = torch.zeros((sum(rows),), dtype=FREE_ROW_DTYPE, device=self.device)
        except RuntimeError as e:  # out of memory: the same error, saying what it was for
            raise type(e)(
                f"dynamicemb: cannot allocate the table state for capacities {caps} and "
                f"row_capacities {rows} ({nbytes} bytes): {e}"
            ) from e
        self.total_buckets = sum(cap // w for cap, w in zip(caps, widths))
        self.keys, self.digests, self.scores, self.free_rows = keys, digests, scores, free_rows
        self._capacities, self._widths, self._row_caps = list(caps), list(widths), list(rows)

    @property
    def num_tables(self) -> int:
        return len(self._capacities)

    @property
    def num_slots(self) -> int:
        return self.keys.numel()

    def capacity(self, table: int = 0) -> int:
        return self._capacities[table]

    def bucket_capacity(self, table: int = 0) -> int:
        return self._widths[table]

    def max_capacity(self, table: int = 0) -> int:
        return self._max_caps[table]

    def row_capacity(self, table: int = 0) -> int:
        return self._row_caps[table]

    def is_no_eviction(self, table: int = 0) -> bool:
        return self._no_eviction[table]

    def slot_range(self, table: int) -> tuple[int, int]:
        off = int(self.info_host[table, enums.InfoCol.SLOT_OFFSET])
        return off, off + self._capacities[table]

    # ------------------------------------------------------------ inputs --

    def _batch(
        self, keys: torch.Tensor, table_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Keys may come from another device (they are copied to the table's);
        # the meta device holds no keys.
        as_tensor(keys, "keys", dtypes=(torch.int64,), dim=1)
        if table_ids is None:
            if self.num_tables != 1:
                raise ValueError(
                    f"table_ids is required for a table of {self.num_tables} fused tables"
                )
            table_ids = torch.zeros_like(keys)
        as_tensor(table_ids, "table_ids", dtypes=(torch.int64,), dim=1)
        if table_ids.shape != keys.shape:
            raise ValueError(
                f"keys and table_ids lengths differ: {keys.numel()} vs {table_ids.numel()}"
            )
        keys = keys.to(self.device).contiguous()
        table_ids = table_ids.to(self.device).contiguous()
        if self.validate and self.device.type != "cpu" and keys.numel():
            self._check_values(keys, table_ids)
        return keys, table_ids

    def _check_values(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        check_keys(keys, "dynamicemb")
        bad = (table_ids < 0) | (table_ids >= self.num_tables)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(
                f"dynamicemb: table id {int(table_ids[i])} at index {i} is out of range "
                f"[0, {self.num_tables})"
            )

    def _check_rows(
        self, keys: torch.Tensor, table_ids: torch.Tensor, values: torch.Tensor
    ) -> None:
        """assign_rows: the row (score column 0) of every new key of a
        NO_EVICTION table lies in its table's rows, is held by no key and is
        given to no other new key (cc/table/row_check.h): the rule the CPU
        run applies itself, checked on the table's device by the
        table_check_rows op (the CUDA run does not check)."""
        state = (self.keys, self.digests, self.scores, self.info, self.free_rows)
        ops().table_check_rows(keys, table_ids, *state, values)

    def _scores(
        self,
        n: int,
        policies: Sequence[int] | None,
        scores: ScoreValues | None,
    ) -> tuple[list[int], torch.Tensor]:
        w = self.num_scores
        if policies is None:
            policies = [
                enums.ScorePolicy.ASSIGN if scores is not None else enums.ScorePolicy.NONE
            ] * w
        policies = _ints(policies, "policies")
        for c, p in enumerate(policies):
            if p not in self._policy_values:
                names = ", ".join(f"{m.value} ({m.name})" for m in enums.ScorePolicy)
                raise ValueError(f"policies[{c}] is {p}, not a score policy: {names}")
        return policies, _score_values(scores, n, w, self.device)

    # -------------------------------------------------------- operations --

    def find(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor | None = None,
        policies: Sequence[int] | None = None,
        scores: ScoreValues | None = None,
        update: bool = False,
    ) -> torch.Tensor:
        """Slots of the keys (-1 where absent); with ``update``, applies the
        score policies to the keys found."""
        _flag(update, "update")
        return ops().table_find(*self._find_args(keys, table_ids, policies, scores), update)

    def find_gather(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        table_ids: torch.Tensor | None = None,
        policies: Sequence[int] | None = None,
        scores: ScoreValues | None = None,
        update: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``find`` fused with the copy of each found key's value row.

        Args:
            values (torch.Tensor): (num_rows, dim) value buffer on the
                table's device, indexed by slot; under NO_EVICTION by the
                tables' row blocks back to back: table t's key of row r (score
                word 0) reads ``values[row_offset(t) + r]``, row_offset(t) the
                row capacities of the tables before t.

        Returns:
            (slots, rows): (n) int64 slots (-1 where absent) and (n, dim) rows,
            zeros where absent.
        """
        as_tensor(values, "values", device=self.device, dim=2)
        _flag(update, "update")
        args = self._find_args(keys, table_ids, policies, scores)
        return ops().table_find_gather(*args, update, values)

    def _find_args(self, keys, table_ids, policies, scores) -> tuple:
        """The arguments table_find and table_find_gather share: the batch,
        the table's state and the score policies with their values."""
        keys, table_ids = self._batch(keys, table_ids)
        policies, values = self._scores(keys.numel(), policies, scores)
        return (
            keys,
            table_ids,
            self.keys,
            self.digests,
            self.scores,
            self.info,
            policies,
            values,
        )

    def _run(
        self,
        op,
        keys,
        table_ids,
        policies,
        scores,
        assign_rows=False,
        victim_scores=None,
        target_slots=None,
        counters=None,
        refuse_cold=False,
        held_slots=None,
    ) -> InsertResult:
        _flag(assign_rows, "assign_rows")
        _flag(refuse_cold, "refuse_cold")
        keys, table_ids = self._batch(keys, table_ids)
        policies, values = self._scores(keys.numel(), policies, scores)
        inserts = op in (enums.RunOp.INSERT, enums.RunOp.INSERT_EVICT)
        if assign_rows and inserts and self.validate and self.device.type != "cpu" and keys.numel():
            self._check_rows(keys, table_ids, values)
        if victim_scores is not None:
            victim_scores = _per_slot(
                victim_scores, "victim_scores", torch.float64, self.num_slots, self.device
            )
        if held_slots is not None:
            held_slots = _per_slot(
                held_slots, "held_slots", torch.bool, self.num_slots, self.device
            )
        out = ops().table_run(
            keys,
            table_ids,
            self.keys,
            self.digests,
            self.scores,
            self.info,
            self.counters if counters is None else counters,
            self.free_rows,
            policies,
            values,
            int(op),
            assign_rows,
            self.total_buckets,
            self.has_rows,
            victim_scores,
            target_slots,
            refuse_cold,
            held_slots,
        )
        return InsertResult(out[0], out[1], EvictedKeys(out[2], out[3], out[4], out[5], out[6]))

    def insert(self, keys, table_ids=None, policies=None, scores=None, assign_rows=False):
        """Find-or-insert without eviction: a key whose bucket is full fails
        (status FAILED, counted in the INSERT_FAILURES counter). Keys already
        in the table are found first, then the new ones placed, each in batch
        order (cc/table/operations.h).

        Args:
            assign_rows (bool): NO_EVICTION tables: each new key brings its
                row in score column 0, a row no key holds and no other new key
                brings (else ValueError, nothing changes); the row allocators
                are rebuilt from the rows held afterwards (cc/table/rows.h).
        """
        return self._run(enums.RunOp.INSERT, keys, table_ids, policies, scores, assign_rows)

    def insert_and_evict(
        self,
        keys,
        table_ids=None,
        policies=None,
        scores=None,
        assign_rows=False,
        victim_scores=None,
        refuse_cold=False,
        held_slots=None,
    ):
        """Find-or-insert; a full bucket evicts its minimum-score key that this
        batch has not touched, so a key of the batch is never evicted by it.
        NO_EVICTION tables behave as in ``insert``.

        Args:
            victim_scores (torch.Tensor, optional): (num_slots) float64, a
                custom eviction score per slot, ranking victims before the
                score words (the victim order: cc/table/scores.h). Only the
                buckets of ``home_starts(keys)`` are read.
            refuse_cold (bool): a new key whose score words would be below
                those of its full bucket's victim is not stored and evicts
                nothing (status REFUSED; cc/table/operations.h, "Refusal").
            held_slots (torch.Tensor, optional): (num_slots) bool, slots the
                call holds from its start as if this batch had found their
                keys: never evicted by it, their keys and scores unchanged (a
                bucket with nothing else to evict fails its new keys). The
                other keys' results are those of the batch after the held
                slots' keys with their own scores assigned, without their work
                (cc/table/operations.h, "Held slots").
        """
        return self._run(
            enums.RunOp.INSERT_EVICT,
            keys,
            table_ids,
            policies,
            scores,
            assign_rows,
            victim_scores,
            refuse_cold=refuse_cold,
            held_slots=held_slots,
        )

    def place(
        self,
        keys: torch.Tensor,
        slots: torch.Tensor,
        table_ids: torch.Tensor | None = None,
        policies: Sequence[int] | None = None,
        scores: ScoreValues | None = None,
        assign_rows: bool = False,
        checked: bool = False,
    ) -> InsertResult:
        """Writes each key at a given slot of its home bucket (replay of a
        table of the same layout); see "Place" in cc/table/operations.h.

        A copy of the key elsewhere in its bucket is removed; a different key
        in the slot is displaced and reported in ``evicted`` (status EVICTED).
        Score words follow the policies as for a new key (ASSIGN: ``scores``).
        A NO_EVICTION table needs ``assign_rows`` (score column 0 is the row);
        its row allocator is then rebuilt from the rows held, as after an
        insert with assign_rows, and gives out none of them.

        Args:
            slots (torch.Tensor): (n) int64, the slot of each key.
            checked (bool): the batch passed ``check_place`` already (the
                CPU kernel still refuses a slot outside its key's bucket).

        Raises:
            ValueError: a slot outside its key's home bucket (checked before
                anything changes; see ``home_starts``), keys and slots of
                different lengths, or repeated keys or slots.
        """
        if checked:
            keys, table_ids = self._batch(keys, table_ids)
            as_tensor(slots, "slots", dtypes=(torch.int64,), dim=1)
            slots = slots.to(self.device).contiguous()
        else:
            keys, table_ids, slots = self.check_place(keys, slots, table_ids)
        return self._run(
            enums.RunOp.PLACE,
            keys,
            table_ids,
            policies,
            scores,
            assign_rows=assign_rows,
            target_slots=slots,
        )

    def check_place(
        self, keys: torch.Tensor, slots: torch.Tensor, table_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Checks a ``place`` batch without changing anything: valid keys,
        one slot per key, each in its key's home bucket, no key or slot twice.
        Returns (keys, table_ids, slots) on the table's device.

        Raises:
            ValueError, TypeError: the first problem found, naming it.
        """
        keys, table_ids = self._batch(keys, table_ids)
        if keys.numel() and self.device.type == "cpu":
            self._check_values(keys, table_ids)
        as_tensor(slots, "slots", dtypes=(torch.int64,), dim=1)
        if slots.shape != keys.shape:
            raise ValueError(f"keys and slots lengths differ: {keys.numel()} vs {slots.numel()}")
        slots = slots.to(self.device).contiguous()
        if keys.numel():
            starts = ops().table_home_starts(keys, table_ids, self.keys, self.info)
            widths = self.info[table_ids, enums.InfoCol.BUCKET_CAPACITY]
            bad = (slots < starts) | (slots >= starts + widths)
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise ValueError(
                    f"dynamicemb: slot {int(slots[i])} of key {int(keys[i])} (index {i}) is not "
                    f"in its home bucket, slots {int(starts[i])}..{int(starts[i] + widths[i]) - 1}"
                    f" of table {int(table_ids[i])}"
                )
            if first_repeat(keys, table_ids) is not None:
                raise ValueError("dynamicemb: place got a key twice")
            if first_repeat(slots) is not None:
                raise ValueError("dynamicemb: place got a slot twice")
        return keys, table_ids, slots

    def slot_mask(self, *slots: torch.Tensor) -> torch.Tensor:
        """(num_slots) bool, True at every slot of the int64 ``slots`` tensors
        (-1 entries mark nothing), on the table's device and read nothing on
        the host: an ``insert_and_evict``'s ``held_slots``."""
        n = self.num_slots
        # One entry past the slots takes the -1s.
        mask = torch.zeros(n + 1, dtype=torch.bool, device=self.device)
        for s in slots:
            if s.numel():
                # index_fill_: a scalar the kernel takes, no host tensor copied
                # (which a CUDA graph's capture refuses).
                mask.index_fill_(0, torch.where(s >= 0, s, n), True)
        return mask[:n]

    def home_starts(
        self, keys: torch.Tensor, table_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """First slot of each key's home bucket (the bucket spans
        ``bucket_capacity(table)`` slots from there): where an insert of the
        key may evict."""
        keys, table_ids = self._batch(keys, table_ids)
        return ops().table_home_starts(keys, table_ids, self.keys, self.info)

    def timer(self) -> torch.Tensor:
        """(1) int64 on the table's device: a reading of the clock the TIMER
        score policy uses (no synchronization)."""
        return ops().table_timer(self.keys)

    def erase(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor | None = None,
        record: bool = False,
    ) -> torch.Tensor:
        """Removes the keys; returns a bool mask of the keys that were present.

        Args:
            record (bool): keep the keys actually removed (each once, with its
                table) until ``pop_erased_keys`` reads them. Recording selects
                the removed keys, which synchronizes on CUDA.
        """
        _flag(record, "record")
        keys_d, tids_d = self._batch(keys, table_ids)
        res = self._run(enums.RunOp.ERASE, keys_d, tids_d, None, None)
        removed = res.status == enums.InsertStatus.FOUND
        if record:
            self._erased.append((keys_d[removed], tids_d[removed]))
        return removed

    def pop_erased_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """The keys recorded by ``erase(record=True)`` since the last call, one
        int64 tensor per table (in erase order), and clears the record.

        Args:
            tables (Sequence[int], optional): pop only these tables (the
                others keep theirs; their entries of the result are empty).
        """
        if self._erased:
            keys = torch.cat([k for k, _ in self._erased])
            tids = torch.cat([t for _, t in self._erased])
        else:
            keys = tids = torch.empty(0, dtype=torch.int64, device=self.device)
        chosen = set(range(self.num_tables) if tables is None else tables)
        popped = torch.tensor(sorted(chosen), dtype=torch.int64, device=self.device)
        kept = ~torch.isin(tids, popped)
        self._erased = [(keys[kept], tids[kept])] if bool(kept.any()) else []
        empty = keys[:0]
        return [keys[tids == t] if t in chosen else empty for t in range(self.num_tables)]

    def export_batch(
        self,
        slot_begin: int = 0,
        slot_end: int | None = None,
        score_column: int = 0,
        threshold: int = INT64_MIN,
    ) -> ExportedBatch:
        """Occupied slots in [slot_begin, slot_end) whose score word
        ``score_column`` is at least ``threshold``, in slot order."""
        slot_begin = as_int(slot_begin, "slot_begin")
        slot_end = self.num_slots if slot_end is None else as_int(slot_end, "slot_end")
        score_column = as_int(score_column, "score_column")
        threshold = as_int(threshold, "threshold")
        if not INT64_MIN <= threshold < 2**63:
            raise ValueError(f"threshold {threshold} does not fit int64")
        out = ops().table_export(
            self.keys, self.scores, self.info, slot_begin, slot_end, score_column, threshold
        )
        return ExportedBatch(*out)

    def size(self) -> torch.Tensor:
        """(num_tables) keys stored, from the device counters (no sync)."""
        return self.counters[:, enums.CounterCol.SIZE]

    def count(self) -> torch.Tensor:
        """(num_tables) occupied slots counted from the keys."""
        return ops().table_count(self.keys, self.info)

    def counter(self, name: str) -> torch.Tensor:
        """(num_tables) one counter column, e.g. ``"EVICTIONS"``."""
        names = [m.name for m in enums.CounterCol]
        if name not in names:
            raise ValueError(f"counter {name!r} is not one of {names}")
        return self.counters[:, enums.CounterCol[name]]

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        """NO_EVICTION: the value row of each slot (-1 stays -1), within its
        table's block of rows (``row_capacity(table)`` of them)."""
        as_tensor(slots, "slots", device=self.device, dtypes=(torch.int64,))
        if self.validate and slots.numel():
            bad = (slots < -1) | (slots >= self.num_slots)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0]) if slots.dim() else 0
                v = int(slots.flatten()[i])
                raise ValueError(f"slot {v} at index {i} is out of range [-1, {self.num_slots})")
        r = self.scores[slots.clamp(min=0), 0]
        return torch.where(slots >= 0, r, slots)

    def load_factor(self) -> torch.Tensor:
        caps = torch.tensor(self._capacities, dtype=torch.float64, device=self.device)
        return self.size().to(torch.float64) / caps

    def memory_per_table(self) -> list[int]:
        """Bytes each table's slots (key, digest, score words) and NO_EVICTION
        free-row entries take on the table's device."""
        slot = self.keys.element_size() + self.digests.element_size()
        slot += self.num_scores * self.scores.element_size()
        row = self.free_rows.element_size()
        return [cap * slot + r * row for cap, r in zip(self._capacities, self._row_caps)]

    # --------------------------------------------------------- expansion --

    def reserve(self, incoming: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Doubles the tables that could exceed max_load_factor (NO_EVICTION:
        ``NO_EVICTION_LOAD_FACTOR``) after ``incoming[t]`` new keys, up to their
        max capacity, and grows NO_EVICTION row capacity to fit. Reads the size
        counters (synchronizes).

        Returns:
            (old_slots, new_slots) of every moved key when the layout changed,
            else None. Values indexed by slot must move accordingly; NO_EVICTION
            rows do not move.
        """
        incoming = _ints(incoming, "incoming", n=self.num_tables, min=0)
        sizes = self.size().cpu().tolist()
        caps = list(self._capacities)
        rows = list(self._row_caps)
        for t in range(self.num_tables):
            lf = NO_EVICTION_LOAD_FACTOR if self._no_eviction[t] else self.max_load_factor
            need = sizes[t] + int(incoming[t])
            while need > lf * caps[t] and caps[t] < self._max_caps[t]:
                caps[t] = min(caps[t] * 2, self._max_caps[t])
            if self._no_eviction[t]:
                next_row = int(self.counters[t, enums.CounterCol.NEXT_ROW])
                free = int(self.counters[t, enums.CounterCol.FREE_TOP])
                while next_row + max(0, int(incoming[t]) - free) > rows[t]:
                    rows[t] = max(1, rows[t] * 2)
        if caps == self._capacities and rows == self._row_caps:
            return None
        return self.relayout(caps, rows)

    def relayout(
        self, capacities: Sequence[int], row_capacities: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rebuilds the table with new capacities (and NO_EVICTION row
        capacities), keeping every key, score, row and counter.

        Returns:
            (old_slots, new_slots) of every key.
        """
        caps = _ints(capacities, "capacities", n=self.num_tables, min=1)
        rows = (
            list(self._row_caps)
            if row_capacities is None
            else _ints(row_capacities, "row_capacities", n=self.num_tables, min=0)
        )
        widths = [cap if one else w for cap, w, one in zip(caps, self._widths, self._one_bucket)]
        for t, (cap, w) in enumerate(zip(caps, widths)):
            self._check_layout(t, cap, w)
            if self._no_eviction[t] and rows[t] < self._row_caps[t]:
                raise ValueError(f"table {t}: row capacity cannot shrink below {self._row_caps[t]}")
        old = self.export_batch().compact()
        old_info = self.info_host
        old_free = self.free_rows
        saved = self.counters
        # The re-insert counts into a fresh tensor; `counters` is replaced only
        # once complete, so a reader on another thread (a metrics collection)
        # sees the old counters or the new ones, never a half-built state.
        counters = torch.zeros_like(saved)
        state = self.state()
        try:
            # An allocation that fails (out of memory) leaves the table as it was.
            self._allocate(caps, widths, rows)
            assign = [enums.ScorePolicy.ASSIGN] * self.num_scores
            res = self._run(
                enums.RunOp.INSERT,
                old.keys,
                old.table_ids,
                assign,
                old.scores,
                assign_rows=True,
                counters=counters,
            )
            # The insert rebuilt the row allocators from the rows held; the
            # free-row stacks are put back as they were, at the new offsets
            # (with the counters, below), so the same rows go out next.
            col = enums.InfoCol
            for t in range(self.num_tables):
                top = int(saved[t, enums.CounterCol.FREE_TOP])
                if top:
                    o = int(old_info[t, col.ROW_OFFSET])
                    nw = int(self.info_host[t, col.ROW_OFFSET])
                    self.free_rows[nw : nw + top] = old_free[o : o + top]
        except BaseException:
            self.restore(state)
            raise
        failed = res.status != enums.InsertStatus.INSERTED
        if bool(failed.any()):
            i = int(failed.nonzero()[0])
            self.restore(state)
            raise RuntimeError(
                f"dynamicemb: relayout could not place key {int(old.keys[i])} of table "
                f"{int(old.table_ids[i])}; the new capacities {caps} are too small"
            )
        size_col = int(enums.CounterCol.SIZE)
        keep = [c for c in range(saved.shape[1]) if c != size_col]
        counters[:, keep] = saved[:, keep]
        self.counters = counters
        self._max_caps = [max(m, c) for m, c in zip(self._max_caps, caps)]
        return old.slots, res.slots

    _STATE = (
        "keys",
        "digests",
        "scores",
        "free_rows",
        "info",
        "info_host",
        "counters",
        "total_buckets",
        "_capacities",
        "_widths",
        "_row_caps",
        "_max_caps",
    )

    def state(self, copy: bool = False) -> dict:
        """Everything the table is (its state tensors, its layout and maximum
        capacities), for ``restore``: the tensors themselves, or with
        ``copy`` clones of them, which later changes in place do not reach."""
        out = {}
        for k in self._STATE:
            v = getattr(self, k)
            if isinstance(v, list):
                v = list(v)
            elif copy and isinstance(v, torch.Tensor):
                v = v.clone()
            out[k] = v
        return out

    def restore(self, state: dict) -> None:
        """Puts back what ``state`` returned."""
        for k, v in state.items():
            setattr(self, k, v)

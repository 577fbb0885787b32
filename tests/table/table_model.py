"""A pure-Python model of the scored hash table, written from the semantic
definition in cc/table/ (layout.h, hash.h, scores.h, operations.h, rows.h and
the layout constants of types.h), without calling the extension.

It is deliberately slow and literal: plain lists, one key at a time. The tests
drive it side by side with ``ScoredHashTable`` and compare every output and the
whole table state.

Semantics modelled:
  * layout: tables are laid out one after another; table t owns the slots
    [slot_offset, slot_offset + capacity); bucket b is the slots
    slot_offset + b * W .. + W - 1.
  * hashing: h = bucket_hash(key) (murmur3's 64-bit finalizer, on the key's two's
    complement bit pattern); home bucket = (h % capacity) // W; digest =
    (h >> 32) & 0xff.
  * insert / insert_and_evict: first every occurrence of a key already in the
    table when the call starts (FOUND, scores updated), then the other keys,
    each group in (global home bucket, batch index) order, one key after
    another. A new key takes the first empty position of its bucket; a full
    bucket (insert_and_evict, evicting table) evicts the untouched slot with
    the smallest (score words..., position); a slot found or filled by the
    batch is never a victim (so no key of the batch is ever evicted by it); a
    key with no slot is FAILED and counted. erase: one key after another in
    (bucket, index) order.
  * refuse_cold (insert_and_evict): a new key whose initial score words are
    below those of the victim it would evict is not stored (REFUSED) and
    evicts nothing.
  * NO_EVICTION tables: never evict; score word 0 is the key's value row, handed
    out after all runs, in batch order per table, first from the free stack
    (top first), then fresh rows; a key that gets no row is not stored (FAILED,
    counted), nor are its repeats in the batch (each FAILED and counted). erase
    pushes the freed rows in batch order. With assign_rows the new keys bring
    their rows (score column 0), which must lie in the table's rows, be held
    by no key and be distinct (else ValueError, nothing changes); afterwards
    every NO_EVICTION table's allocator is rebuilt from the rows its keys hold:
    next row = highest held + 1, the free stack = the other rows below it,
    the lowest on top.
  * scores: per column NONE (new keys 0, residents unchanged), ASSIGN (the
    given value), ACCUMULATE (new keys the value, residents add it, saturating
    at the int64 bounds), TIMER (one clock reading per call: the model has no
    clock, the caller passes `now`).
"""

from collections.abc import Sequence

MASK64 = (1 << 64) - 1

# cc/table/types.h
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EMPTY_KEY = -(2**63)
FIRST_VALID_KEY = EMPTY_KEY + 4
BUCKET_ALIGNMENT = 16

# ScorePolicy
NONE, ASSIGN, ACCUMULATE, TIMER = 0, 1, 2, 3
# InsertStatus
FOUND, INSERTED, EVICTED, FAILED, INVALID, RELEASED, REFUSED = 0, 1, 2, 3, 4, 5, 6
# RunOp
OP_INSERT, OP_INSERT_EVICT, OP_ERASE, OP_PLACE = 0, 1, 2, 3
# CounterCol
SIZE, INSERT_FAILURES, EVICTIONS, NEXT_ROW, FREE_TOP, INSERTS = 0, 1, 2, 3, 4, 5
# The model's state that a relayout replaces.
_LAYOUT_FIELDS = (
    "caps",
    "widths",
    "slot_offsets",
    "bucket_offsets",
    "num_slots",
    "keys",
    "scores",
    "counters",
    "row_caps",
)
NUM_COUNTERS = 6


def bucket_hash(key: int) -> int:
    """murmur3's fmix64 of the key's 64-bit pattern, as an unsigned int."""
    k = key & MASK64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & MASK64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & MASK64
    k ^= k >> 33
    return k


def digest_of(key: int) -> int:
    return (bucket_hash(key) >> 32) & 0xFF


EMPTY_DIGEST = digest_of(EMPTY_KEY)


class RunResult:
    """Outputs of one insert / insert_and_evict / erase."""

    def __init__(self, n: int) -> None:
        self.slots: list[int] = [-1] * n
        self.status: list[int] = [FAILED] * n
        # (key, scores tuple, slot, table), in (bucket, batch index) order.
        self.evicted: list[tuple[int, tuple[int, ...], int, int]] = []


class TableModel:
    """Reference model of ``ScoredHashTable``."""

    def __init__(
        self,
        capacities: Sequence[int],
        bucket_capacities=128,
        num_scores: int = 1,
        no_eviction=False,
        max_capacities=None,
        row_capacities=None,
        max_load_factor: float = 0.5,
    ) -> None:
        n = len(capacities)

        def per_table(v):
            return list(v) if isinstance(v, (list, tuple)) else [v] * n

        self.num_scores = num_scores
        self.max_load_factor = max_load_factor
        self.one_bucket = [w is None for w in per_table(bucket_capacities)]
        caps = [int(c) for c in capacities]
        widths = [c if w is None else int(w) for c, w in zip(caps, per_table(bucket_capacities))]
        for c, w in zip(caps, widths):
            if w <= 0 or w % BUCKET_ALIGNMENT or c <= 0 or c % w:
                raise ValueError(f"bad layout: capacity {c}, bucket capacity {w}")
        self.no_eviction = [bool(x) for x in per_table(no_eviction)]
        self.max_caps = [
            c if m is None else int(m) for c, m in zip(caps, per_table(max_capacities))
        ]
        rows = per_table(row_capacities)
        self.row_caps = [
            ((c if r is None else int(r)) if ne else 0)
            for c, r, ne in zip(caps, rows, self.no_eviction)
        ]
        self.counters = [[0] * NUM_COUNTERS for _ in range(n)]
        self.now: int | None = None
        self.free_stack: list[list[int]] = [[] for _ in range(n)]  # top = end
        self._layout(caps, widths)

    # ------------------------------------------------------------ layout --

    def _layout(self, caps: list[int], widths: list[int]) -> None:
        self.caps = list(caps)
        self.widths = list(widths)
        self.slot_offsets, self.bucket_offsets = [], []
        slot = bucket = 0
        for c, w in zip(caps, widths):
            self.slot_offsets.append(slot)
            self.bucket_offsets.append(bucket)
            slot += c
            bucket += c // w
        self.num_slots = slot
        self.keys = [EMPTY_KEY] * slot
        self.scores = [[0] * self.num_scores for _ in range(slot)]

    @property
    def num_tables(self) -> int:
        return len(self.caps)

    @property
    def has_rows(self) -> bool:
        return any(self.no_eviction)

    def home(self, table: int, key: int) -> tuple[int, int, int]:
        """(first slot of the home bucket, bucket width, global bucket index)."""
        cap, w = self.caps[table], self.widths[table]
        local = (bucket_hash(key) % cap) // w
        return self.slot_offsets[table] + local * w, w, self.bucket_offsets[table] + local

    def table_of_slot(self, slot: int) -> int:
        for t in range(self.num_tables):
            if self.slot_offsets[t] <= slot < self.slot_offsets[t] + self.caps[t]:
                return t
        raise IndexError(slot)

    def digests(self) -> list[int]:
        return [EMPTY_DIGEST if k == EMPTY_KEY else digest_of(k) for k in self.keys]

    def _locate(self, table: int, key: int) -> int:
        start, w, _ = self.home(table, key)
        for p in range(w):
            if self.keys[start + p] == key:
                return start + p
        return -1

    # ------------------------------------------------------------ scores --

    @staticmethod
    def _value(values: list[list[int]], i: int, c: int) -> int:
        return values[0 if len(values) == 1 else i][c]

    def _clock(self) -> int:
        if self.now is None:
            raise ValueError("a TIMER policy needs the clock reading: pass now=")
        return self.now

    def _initial(self, policies, values, i) -> list[int]:
        out = []
        for c, p in enumerate(policies):
            if p in (ASSIGN, ACCUMULATE):
                out.append(self._value(values, i, c))
            elif p == TIMER:
                out.append(self._clock())
            else:
                out.append(0)
        return out

    def _update(self, slot, policies, values, i) -> None:
        s = self.scores[slot]
        for c, p in enumerate(policies):
            if p == ASSIGN:
                s[c] = self._value(values, i, c)
            elif p == ACCUMULATE:
                s[c] = min(INT64_MAX, max(INT64_MIN, s[c] + self._value(values, i, c)))
            elif p == TIMER:
                s[c] = self._clock()

    # -------------------------------------------------------- operations --

    def find(
        self, keys, table_ids, policies=None, values=None, update=False, now=None
    ) -> list[int]:
        """Slots (-1 where absent). TIMER sets the score to `now`: the model has
        no clock, the caller passes the one reading the whole call uses."""
        self.now = now
        policies = policies or [NONE] * self.num_scores
        values = values or [[0] * self.num_scores]
        out = []
        for i, (k, t) in enumerate(zip(keys, table_ids)):
            slot = self._locate(t, k)
            if slot >= 0 and update and not self.no_eviction[t]:
                self._update(slot, policies, values, i)
            out.append(slot)
        return out

    def run(
        self,
        op,
        keys,
        table_ids,
        policies=None,
        values=None,
        assign_rows=False,
        now=None,
        refuse_cold=False,
    ):
        """insert / insert_and_evict / erase of one batch; TIMER uses `now`.
        With refuse_cold, a new key whose initial score words are below its
        full bucket's victim's is not stored (REFUSED)."""
        self.now = now
        keys, table_ids = list(keys), list(table_ids)
        n = len(keys)
        policies = policies or [NONE] * self.num_scores
        values = values or [[0] * self.num_scores]
        res = RunResult(n)
        for k, t in zip(keys, table_ids):
            if k < FIRST_VALID_KEY or not 0 <= t < self.num_tables:
                raise ValueError(f"invalid key {k} or table id {t}")
        order = sorted(range(n), key=lambda i: (self.home(table_ids[i], keys[i])[2], i))
        if op != OP_ERASE:
            # Keys in the table when the call starts come first.
            resident = [self._locate(table_ids[i], keys[i]) >= 0 for i in range(n)]
            if assign_rows:
                self._check_assigned_rows(keys, table_ids, values, resident)
            order = [i for i in order if resident[i]] + [i for i in order if not resident[i]]
        touched: dict[int, set] = {}  # global bucket -> slots found or filled in this batch
        need_row: list[int] = []  # batch indices of new NO_EVICTION keys
        freed: list[tuple[int, int, int]] = []  # (batch index, table, row)
        for i in order:
            key, t = keys[i], table_ids[i]
            start, w, gb = self.home(t, key)
            ne = self.no_eviction[t]
            cnt = self.counters[t]
            done = touched.setdefault(gb, set())
            pos = next((p for p in range(w) if self.keys[start + p] == key), -1)
            if op == OP_ERASE:
                if pos < 0:
                    res.slots[i], res.status[i] = -1, FAILED
                    continue
                slot = start + pos
                if ne and self.has_rows:
                    freed.append((i, t, self.scores[slot][0]))
                self.keys[slot] = EMPTY_KEY
                self.scores[slot] = [0] * self.num_scores
                res.slots[i], res.status[i] = slot, FOUND
                cnt[SIZE] -= 1
                continue
            if pos >= 0:
                slot = start + pos
                if not ne:
                    self._update(slot, policies, values, i)
                res.slots[i], res.status[i] = slot, FOUND
                done.add(slot)
                continue
            target = next((p for p in range(w) if self.keys[start + p] == EMPTY_KEY), -1)
            status = INSERTED
            if target < 0:
                if op == OP_INSERT_EVICT and not ne:
                    cands = [p for p in range(w) if start + p not in done]
                    if cands:
                        target = min(cands, key=lambda p: (tuple(self.scores[start + p]), p))
                        status = EVICTED
                        initial = self._initial(policies, values, i)
                        if refuse_cold and initial < self.scores[start + target]:
                            res.slots[i], res.status[i] = -1, REFUSED
                            continue
                if target < 0:
                    res.slots[i], res.status[i] = -1, FAILED
                    cnt[INSERT_FAILURES] += 1
                    continue
                v = start + target
                res.evicted.append((self.keys[v], tuple(self.scores[v]), v, t))
                cnt[EVICTIONS] += 1
            else:
                cnt[SIZE] += 1
            slot = start + target
            self.keys[slot] = key
            if ne:
                row = self._value(values, i, 0) if assign_rows else -1
                if not assign_rows:
                    need_row.append(i)
                self.scores[slot] = [row] + [0] * (self.num_scores - 1)
            else:
                self.scores[slot] = self._initial(policies, values, i)
            res.slots[i], res.status[i] = slot, status
            cnt[INSERTS] += 1
            done.add(slot)

        if self.has_rows and op != OP_ERASE and assign_rows:
            self._rebuild_row_allocators()
        if self.has_rows and op == OP_ERASE:
            for _, t, row in sorted(freed):
                self.free_stack[t].append(row)
                self.counters[t][FREE_TOP] += 1
        elif self.has_rows:
            rowless = set()
            for i in sorted(need_row):
                t = table_ids[i]
                cnt = self.counters[t]
                slot = res.slots[i]
                if self.free_stack[t]:
                    row = self.free_stack[t].pop()
                    cnt[FREE_TOP] -= 1
                elif cnt[NEXT_ROW] < self.row_caps[t]:
                    row = cnt[NEXT_ROW]
                    cnt[NEXT_ROW] += 1
                else:
                    # No row: the key is not stored.
                    self.keys[slot] = EMPTY_KEY
                    self.scores[slot] = [0] * self.num_scores
                    cnt[SIZE] -= 1
                    cnt[INSERTS] -= 1
                    cnt[INSERT_FAILURES] += 1
                    res.slots[i], res.status[i] = -1, FAILED
                    rowless.add((t, keys[i]))
                    continue
                self.scores[slot][0] = row
            # A repeat of a key that got no row found a slot that is gone: it
            # is not stored either.
            for i in range(n):
                if res.status[i] == FOUND and (table_ids[i], keys[i]) in rowless:
                    res.slots[i], res.status[i] = -1, FAILED
                    self.counters[table_ids[i]][INSERT_FAILURES] += 1
        return res

    def _held_rows(self, table: int) -> dict[int, int]:
        """Row -> key of the keys a NO_EVICTION table holds."""
        lo = self.slot_offsets[table]
        return {
            self.scores[s][0]: self.keys[s]
            for s in range(lo, lo + self.caps[table])
            if self.keys[s] != EMPTY_KEY
        }

    def _check_assigned_rows(self, keys, table_ids, values, resident) -> None:
        held = {t: self._held_rows(t) for t in range(self.num_tables) if self.no_eviction[t]}
        seen = set()
        for i, (k, t) in enumerate(zip(keys, table_ids)):
            if not self.no_eviction[t] or resident[i] or (t, k) in seen:
                continue
            seen.add((t, k))
            row = self._value(values, i, 0)
            if not 0 <= row < self.row_caps[t]:
                raise ValueError(f"row {row} at index {i} is out of range")
            if row in held[t]:
                raise ValueError(f"row {row} at index {i} is held by key {held[t][row]}")
            held[t][row] = k

    def _rebuild_row_allocators(self) -> None:
        for t in range(self.num_tables):
            if not self.no_eviction[t]:
                continue
            held = self._held_rows(t)
            nxt = max(held) + 1 if held else 0
            self.free_stack[t] = [r for r in range(nxt - 1, -1, -1) if r not in held]
            self.counters[t][NEXT_ROW] = nxt
            self.counters[t][FREE_TOP] = len(self.free_stack[t])

    def place(
        self, keys, table_ids, slots, policies=None, values=None, assign_rows=False, now=None
    ):
        """place: each key into the given slot of its home bucket, batch in
        (bucket, index) order; a copy elsewhere in the bucket is removed, an
        occupant displaced (reported as evicted). NO_EVICTION rows are given by
        values[.][0]; the allocators are rebuilt from the rows held, as after
        an insert with assign_rows."""
        self.now = now
        keys, table_ids, slots = list(keys), list(table_ids), list(slots)
        n = len(keys)
        policies = policies or [NONE] * self.num_scores
        values = values or [[0] * self.num_scores]
        res = RunResult(n)
        order = sorted(range(n), key=lambda i: (self.home(table_ids[i], keys[i])[2], i))
        for i in order:
            key, t, slot = keys[i], table_ids[i], slots[i]
            start, w, _ = self.home(t, key)
            if not start <= slot < start + w:
                raise ValueError(f"slot {slot} of key {key} is not in its home bucket")
            cnt = self.counters[t]
            old = self._locate(t, key)
            if old >= 0 and old != slot:
                self.keys[old] = EMPTY_KEY
                self.scores[old] = [0] * self.num_scores
                cnt[SIZE] -= 1
            occupant = self.keys[slot]
            status = FOUND
            if occupant == EMPTY_KEY:
                status = INSERTED
                cnt[SIZE] += 1
                cnt[INSERTS] += 1
            elif occupant != key:
                status = EVICTED
                res.evicted.append((occupant, tuple(self.scores[slot]), slot, t))
                cnt[EVICTIONS] += 1
                cnt[INSERTS] += 1
            self.keys[slot] = key
            if self.no_eviction[t]:
                self.scores[slot] = [self._value(values, i, 0)] + [0] * (self.num_scores - 1)
            else:
                self.scores[slot] = self._initial(policies, values, i)
            res.slots[i], res.status[i] = slot, status
        if self.has_rows and assign_rows:
            self._rebuild_row_allocators()
        return res

    def insert(self, keys, table_ids, policies=None, values=None, assign_rows=False, now=None):
        return self.run(OP_INSERT, keys, table_ids, policies, values, assign_rows, now)

    def insert_and_evict(
        self, keys, table_ids, policies=None, values=None, assign_rows=False, now=None, refuse=False
    ):
        return self.run(
            OP_INSERT_EVICT, keys, table_ids, policies, values, assign_rows, now, refuse_cold=refuse
        )

    def erase(self, keys, table_ids) -> list[bool]:
        res = self.run(OP_ERASE, keys, table_ids)
        return [s == FOUND for s in res.status]

    def export_batch(self, slot_begin=0, slot_end=None, score_column=0, threshold=-(2**63)):
        """[(key, slot, table, scores tuple)] in slot order."""
        slot_end = self.num_slots if slot_end is None else slot_end
        out = []
        for s in range(slot_begin, slot_end):
            if self.keys[s] != EMPTY_KEY and self.scores[s][score_column] >= threshold:
                out.append((self.keys[s], s, self.table_of_slot(s), tuple(self.scores[s])))
        return out

    def count(self) -> list[int]:
        return [
            sum(1 for s in range(o, o + c) if self.keys[s] != EMPTY_KEY)
            for o, c in zip(self.slot_offsets, self.caps)
        ]

    def rows_in_use(self, table: int) -> int:
        return self.counters[table][NEXT_ROW] - self.counters[table][FREE_TOP]

    # --------------------------------------------------------- expansion --

    def relayout(self, capacities, row_capacities=None) -> tuple[list[int], list[int]]:
        """Rebuilds with new capacities, re-inserting every key in slot order.
        Raises RuntimeError (state unchanged) if a key finds no slot."""
        caps = [int(c) for c in capacities]
        widths = [c if one else w for c, w, one in zip(caps, self.widths, self.one_bucket)]
        rows = list(self.row_caps if row_capacities is None else row_capacities)
        for c, w in zip(caps, widths):
            if w <= 0 or w % BUCKET_ALIGNMENT or c <= 0 or c % w:
                raise ValueError(f"bad layout: capacity {c}, bucket capacity {w}")
        for t in range(self.num_tables):
            if self.no_eviction[t] and rows[t] < self.row_caps[t]:
                raise ValueError("row capacity cannot shrink")
        old = self.export_batch()
        # What _layout replaces: put back as it was if a key cannot be placed.
        saved = {f: getattr(self, f) for f in _LAYOUT_FIELDS}
        saved["counters"] = [list(c) for c in self.counters]
        self._layout(caps, widths)
        self.row_caps = rows
        new_slots = []
        for key, _, t, sc in old:
            start, w, _ = self.home(t, key)
            p = next((p for p in range(w) if self.keys[start + p] == EMPTY_KEY), -1)
            if p < 0:
                self.__dict__.update(saved)
                raise RuntimeError(f"relayout could not place key {key} of table {t}")
            self.keys[start + p] = key
            self.scores[start + p] = list(sc)
            new_slots.append(start + p)
        self.max_caps = [max(m, c) for m, c in zip(self.max_caps, caps)]
        return [s for _, s, _, _ in old], new_slots

    def reserve(self, incoming: Sequence[int]):
        """The growth rule of ScoredHashTable.reserve: double a table while
        size + incoming exceeds its load limit (NO_EVICTION: 0.5), up to its max
        capacity; grow NO_EVICTION rows to fit. Returns relayout's result or None."""
        caps, rows = list(self.caps), list(self.row_caps)
        for t in range(self.num_tables):
            lf = 0.5 if self.no_eviction[t] else self.max_load_factor
            need = self.counters[t][SIZE] + int(incoming[t])
            while need > lf * caps[t] and caps[t] < self.max_caps[t]:
                caps[t] = min(caps[t] * 2, self.max_caps[t])
            if self.no_eviction[t]:
                nxt, free = self.counters[t][NEXT_ROW], self.counters[t][FREE_TOP]
                while nxt + max(0, int(incoming[t]) - free) > rows[t]:
                    rows[t] = max(1, rows[t] * 2)
        if caps == self.caps and rows == self.row_caps:
            return None
        return self.relayout(caps, rows)

"""A pure-Python model of MultiTableKVCounter, written from its definition
(dynamicemb/admission/counters.py, cc/admission/counter.h) on top of the
table's model (tests/table/table_model.py): the same layout, hash, home
buckets and victim order, counts in score word 0.

Semantics modelled (``add_and_release``): keys are taken one after another,
first every occurrence of a key stored when the call starts, then the other
keys, each group in call order; an occurrence of a stored key that an earlier
occurrence released is taken with the other keys, as a new key (the table's
batch order, "Bulk operations" in cc/table/operations.h; the kernels go bucket
by bucket, which gives the same result: a key only reads and writes its own
bucket). A key's count is its stored count
(0 when absent) plus its frequency. A count at or above ``release_at`` leaves:
a stored key is erased, an absent one is not stored. A lower count is stored;
an absent key takes the first free slot of its bucket, else evicts the
smallest (count, position) of the bucket that no earlier key of the call has
found or filled, else is not stored (an insert failure).
"""

from tests.table.table_model import (
    EMPTY_KEY,
    EVICTIONS,
    INSERT_FAILURES,
    INSERTS,
    SIZE,
    TableModel,
)

NEVER = 2**63 - 1


def aligned(capacity: int, bucket_capacity: int) -> int:
    """A KVCounter's capacity in whole buckets."""
    return max(1, -(-capacity // bucket_capacity)) * bucket_capacity


class CounterModel(TableModel):
    """Reference of ``MultiTableKVCounter`` for KVCounter shares given as
    (capacity, bucket_capacity) pairs."""

    def __init__(self, shares) -> None:
        shares = list(shares)
        super().__init__(
            [aligned(c, w) for c, w in shares],
            bucket_capacities=[w for _, w in shares],
            num_scores=1,
        )
        # slot -> True for the slots found or filled by the current call
        self._touched: set[int] = set()

    def add_and_release(self, keys, table_ids, frequencies, release_at=NEVER) -> list[int]:
        self._touched = set()
        batch = [(int(k), int(t), int(f)) for k, t, f in zip(keys, table_ids, frequencies)]
        stored = [self._locate(t, k) >= 0 for k, t, _ in batch]
        out = [0] * len(batch)
        later = []  # the other keys, and stored keys released earlier in the call
        for i, (k, t, f) in enumerate(batch):
            if not stored[i]:
                later.append(i)
            elif self._locate(t, k) < 0:
                later.append(i)
            else:
                out[i] = self._one(k, t, f, release_at)
        for i in sorted(later):
            out[i] = self._one(*batch[i], release_at)
        return out

    def add(self, keys, table_ids, frequencies) -> list[int]:
        return self.add_and_release(keys, table_ids, frequencies, NEVER)

    def _one(self, key: int, table: int, freq: int, release_at: int) -> int:
        start, w, _ = self.home(table, key)
        cnt = self.counters[table]
        slot = self._locate(table, key)
        if slot >= 0:
            count = self.scores[slot][0] + freq
            if count >= release_at:
                self.keys[slot] = EMPTY_KEY
                self.scores[slot] = [0]
                cnt[SIZE] -= 1
            else:
                self.scores[slot][0] = count
                self._touched.add(slot)
            return count
        count = freq
        if count >= release_at:
            return count
        free = [start + p for p in range(w) if self.keys[start + p] == EMPTY_KEY]
        if free:
            target = free[0]
            cnt[SIZE] += 1
        else:
            cands = [start + p for p in range(w) if start + p not in self._touched]
            if not cands:
                cnt[INSERT_FAILURES] += 1
                return count
            target = min(cands, key=lambda s: (self.scores[s][0], s))
            cnt[EVICTIONS] += 1
        self.keys[target] = key
        self.scores[target] = [count]
        cnt[INSERTS] += 1
        self._touched.add(target)
        return count

    def get(self, key: int, table: int) -> int:
        slot = self._locate(table, key)
        return self.scores[slot][0] if slot >= 0 else 0

    def dump(self, table: int) -> list[tuple[int, int]]:
        """(key, count) of one table in slot order."""
        return [(k, sc[0]) for k, _, t, sc in self.export_batch() if t == table]

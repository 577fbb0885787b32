"""Targeted tests of the scored hash table with hand-computed expectations.

Slots are predicted from the hash definition in cc/table/hash.h (reimplemented
in table_model.bucket_hash), never read back from the code under test. In a table of
one bucket every key shares the bucket, so a new key takes the first empty
position and its slot is predictable by hand.
"""

import time

import pytest
import torch

from dynamicemb.table import ScoredHashTable, constants
from dynamicemb.table._native import extension
from tests.devices import DEVICES
from tests.table import table_model as M
from tests.table.table_testlib import (
    assert_matches_model,
    assert_rows_consistent,
    assert_same_snapshot,
    evicted_records,
    exported_records,
    i64,
    keys_in_bucket,
    snapshot,
    status_names,
)

OPS = torch.ops.dynamicemb
ASSIGN, ACCUMULATE, NONE, TIMER = M.ASSIGN, M.ACCUMULATE, M.NONE, M.TIMER


def one_bucket(device, capacity=16, num_scores=1, **kw) -> ScoredHashTable:
    return ScoredHashTable(
        [capacity], bucket_capacities=None, num_scores=num_scores, device=device, **kw
    )


def per_key(values, device, num_scores=1):
    return i64([v for row in values for v in (row if num_scores > 1 else [row])], device).reshape(
        -1, num_scores
    )


def fill(table, keys, scores, device, num_scores=1, policies=None):
    """Inserts `keys` with per-key ASSIGN scores; all must be new."""
    policies = policies or [ASSIGN] * num_scores
    res = table.insert(
        i64(keys, device), policies=policies, scores=per_key(scores, device, num_scores)
    )
    assert status_names(res.status) == ["INSERTED"] * len(keys)
    return res


# ------------------------------------------------------------- constants --


def test_extension_constants_are_the_values_of_types_h():
    c = constants()
    assert c["EMPTY_KEY"] == M.EMPTY_KEY
    assert c["FIRST_VALID_KEY"] == M.FIRST_VALID_KEY
    assert c["BUCKET_ALIGNMENT"] == M.BUCKET_ALIGNMENT
    assert c["EMPTY_DIGEST"] == M.EMPTY_DIGEST
    assert dict(c["ScorePolicy"]) == {"NONE": 0, "ASSIGN": 1, "ACCUMULATE": 2, "TIMER": 3}
    assert dict(c["InsertStatus"]) == {
        "FOUND": 0,
        "INSERTED": 1,
        "EVICTED": 2,
        "FAILED": 3,
        "INVALID": 4,
        "RELEASED": 5,
        "REFUSED": 6,
    }
    assert dict(c["RunOp"]) == {"INSERT": 0, "INSERT_EVICT": 1, "ERASE": 2, "PLACE": 3}
    assert {k: c["CounterCol"][k] for k in ("SIZE", "INSERT_FAILURES", "EVICTIONS")} == {
        "SIZE": M.SIZE,
        "INSERT_FAILURES": M.INSERT_FAILURES,
        "EVICTIONS": M.EVICTIONS,
    }
    assert (
        c["CounterCol"]["NEXT_ROW"],
        c["CounterCol"]["FREE_TOP"],
        c["CounterCol"]["INSERTS"],
    ) == (
        M.NEXT_ROW,
        M.FREE_TOP,
        M.INSERTS,
    )


def test_hash_is_murmur3_fmix64_of_the_key_bits():
    keys = [0, 1, 2, 7, -1, -2, 2**62, 2**63 - 1, M.FIRST_VALID_KEY, M.EMPTY_KEY, 123456789]
    got = extension().hash_keys(i64(keys)).tolist()
    assert [g & M.MASK64 for g in got] == [M.bucket_hash(k) for k in keys]
    assert M.bucket_hash(0) == 0  # fmix64 fixes 0


@pytest.mark.parametrize("device", DEVICES)
def test_keys_live_in_their_home_bucket_with_their_digest(device):
    caps, width = [64, 128], 16
    t = ScoredHashTable(caps, bucket_capacities=width, device=device)
    keys = list(range(-20, 20)) + [2**63 - 1, M.FIRST_VALID_KEY]
    for tid, off in ((0, 0), (1, 64)):
        res = t.insert(i64(keys, device), i64([tid] * len(keys), device))
        for k, s, st in zip(keys, res.slots.tolist(), status_names(res.status)):
            if st == "FAILED":
                continue
            bucket = (M.bucket_hash(k) % caps[tid]) // width
            assert off + bucket * width <= s < off + (bucket + 1) * width, (k, s)
            assert int(t.digests[s]) == M.digest_of(k)


# -------------------------------------------------------------- eviction --


@pytest.mark.parametrize("device", DEVICES)
def test_evicted_victim_is_the_minimum_score_ties_to_lowest_position(device):
    t = one_bucket(device)
    keys = [100 + i for i in range(16)]
    scores = [5, 3, 7, 3, 9, 8, 6, 4, 9, 9, 9, 9, 9, 9, 9, 9]
    assert fill(t, keys, scores, device).slots.tolist() == list(range(16))

    res = t.insert_and_evict(i64([500], device), scores=i64([[50]], device))
    assert status_names(res.status) == ["EVICTED"]
    assert res.slots.tolist() == [1]  # scores 3 at positions 1 and 3: lowest position
    assert evicted_records(res) == [(101, (3,), 1, 0)]

    res = t.insert_and_evict(i64([501], device), scores=i64([[50]], device))
    assert res.slots.tolist() == [3]
    assert evicted_records(res) == [(103, (3,), 3, 0)]

    res = t.insert_and_evict(i64([502], device), scores=i64([[50]], device))
    assert res.slots.tolist() == [7]  # next minimum: 4
    assert evicted_records(res) == [(107, (4,), 7, 0)]
    assert t.counter("EVICTIONS").tolist() == [3]
    assert t.size().tolist() == [16]


@pytest.mark.parametrize("device", DEVICES)
def test_eviction_order_within_a_batch_follows_batch_order(device):
    t = one_bucket(device)
    fill(t, [100 + i for i in range(16)], list(range(16, 0, -1)), device)  # min at the end
    res = t.insert_and_evict(i64([7, 8, 9], device), scores=i64([[99]], device))
    assert res.slots.tolist() == [15, 14, 13]
    assert evicted_records(res) == [(115, (1,), 15, 0), (114, (2,), 14, 0), (113, (3,), 13, 0)]
    assert int(res.evicted.count) == 3


@pytest.mark.parametrize("device", DEVICES)
def test_batch_never_evicts_a_slot_it_touched_and_reports_failed(device):
    t = one_bucket(device)
    keys = [100 + i for i in range(16)]
    fill(t, keys, list(range(1, 17)), device)  # key 100 has the minimum score
    batch = [100] + [200 + i for i in range(16)]
    res = t.insert_and_evict(i64(batch, device), scores=i64([[0]], device))
    # 100 is found (touched); each new key evicts the next untouched minimum,
    # the last finds only touched slots.
    assert status_names(res.status) == ["FOUND"] + ["EVICTED"] * 15 + ["FAILED"]
    assert res.slots.tolist() == [0] + list(range(1, 16)) + [-1]
    assert [r[0] for r in evicted_records(res)] == keys[1:]
    assert t.counter("INSERT_FAILURES").tolist() == [1]
    assert t.counter("EVICTIONS").tolist() == [15]
    assert t.size().tolist() == [16]
    # Every slot handed back still holds the key it was handed to.
    table_keys = t.keys.tolist()
    for k, s in zip(batch, res.slots.tolist()):
        if s >= 0:
            assert table_keys[s] == k
    assert 216 not in table_keys


@pytest.mark.parametrize("device", DEVICES)
def test_insert_into_full_bucket_fails_and_counts_without_evicting(device):
    t = one_bucket(device)
    fill(t, list(range(16)), [1] * 16, device)
    before = t.keys.clone()
    res = t.insert(i64([50, 51, 3], device))
    assert status_names(res.status) == ["FAILED", "FAILED", "FOUND"]
    assert res.slots.tolist() == [-1, -1, 3]
    assert int(res.evicted.count) == 0
    assert torch.equal(t.keys, before)
    assert t.counter("INSERT_FAILURES").tolist() == [2]
    assert t.counter("EVICTIONS").tolist() == [0]
    assert t.counter("INSERTS").tolist() == [16]


@pytest.mark.parametrize("device", DEVICES)
def test_resident_key_later_in_the_batch_is_found_not_evicted_by_it(device):
    t = one_bucket(device)
    fill(t, list(range(16)), list(range(1, 17)), device)  # key 0 is the minimum
    res = t.insert_and_evict(i64([90, 0], device), scores=i64([[50]], device))
    # 0 is in the table when the call starts: it is found first (its slot and
    # row kept), so 90 evicts the next minimum, key 1.
    assert status_names(res.status) == ["EVICTED", "FOUND"]
    assert res.slots.tolist() == [1, 0]
    assert evicted_records(res) == [(1, (2,), 1, 0)]
    assert t.find(i64([0, 1, 90], device)).tolist() == [0, -1, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_compound_scores_evict_least_frequent_then_older_timestamp(device):
    """(frequency, timestamp) words: the victim is the least frequent key and,
    among those, the one with the older timestamp, whatever its position."""
    t = one_bucket(device, num_scores=2)
    keys = [100 + i for i in range(16)]
    # (freq, ts): position 2 and 9 have frequency 1; 9 is older.
    fs = [(3, 50)] * 16
    fs[2], fs[9] = (1, 40), (1, 20)
    fill(t, keys, fs, device, num_scores=2)
    res = t.insert_and_evict(
        i64([7], device), policies=[ACCUMULATE, ASSIGN], scores=i64([[1, 60]], device)
    )
    assert res.slots.tolist() == [9]
    assert evicted_records(res) == [(109, (1, 20), 9, 0)]
    assert t.scores[9].tolist() == [1, 60]
    # Next: (1, 40) at position 2 is older than the new key's (1, 60).
    res = t.insert_and_evict(
        i64([8], device), policies=[ACCUMULATE, ASSIGN], scores=i64([[1, 70]], device)
    )
    assert evicted_records(res) == [(102, (1, 40), 2, 0)]


@pytest.mark.parametrize("device", DEVICES)
def test_compound_timer_scores_evict_the_older_of_two_least_frequent(device):
    """LFU + TIMESTAMP with the real timer: the newer key sits at a lower
    position than the older one, so only the timestamp can pick the older."""
    t = one_bucket(device, num_scores=2)
    old = [100 + i for i in range(16)]
    t.insert(i64(old, device), policies=[ACCUMULATE, TIMER], scores=i64([[1, 0]], device))
    assert t.erase(i64([100], device)).tolist() == [True]  # frees position 0
    time.sleep(0.002)
    res = t.insert(i64([300], device), policies=[ACCUMULATE, TIMER], scores=i64([[1, 0]], device))
    assert res.slots.tolist() == [0]
    # Every old key but 107 becomes more frequent (NONE keeps their timestamps).
    bump = [k for k in old[1:] if k != 107]
    t.find(
        i64(bump, device), policies=[ACCUMULATE, NONE], scores=i64([[1, 0]], device), update=True
    )
    assert int(t.scores[0, 1]) > int(t.scores[7, 1])
    res = t.insert_and_evict(
        i64([400], device), policies=[ACCUMULATE, TIMER], scores=i64([[1, 0]], device)
    )
    assert res.slots.tolist() == [7]
    assert evicted_records(res)[0][0] == 107


# ---------------------------------------------------------------- scores --


@pytest.mark.parametrize("device", DEVICES)
def test_assign_sets_the_score_on_insert_found_and_find_update(device):
    t = one_bucket(device)
    res = t.insert(i64([5, 6], device), policies=[ASSIGN], scores=i64([[11], [12]], device))
    s5, s6 = res.slots.tolist()
    assert t.scores[[s5, s6], 0].tolist() == [11, 12]
    t.insert(i64([5], device), policies=[ASSIGN], scores=i64([[4]], device))
    assert int(t.scores[s5, 0]) == 4
    t.find(i64([6], device), policies=[ASSIGN], scores=i64([[9]], device), update=True)
    assert int(t.scores[s6, 0]) == 9
    t.find(i64([6], device), policies=[ASSIGN], scores=i64([[1]], device), update=False)
    assert int(t.scores[s6, 0]) == 9
    # A broadcast row assigns every key the same value.
    t.insert_and_evict(i64([5, 6, 7], device), policies=[ASSIGN], scores=i64([[3]], device))
    assert t.scores[[s5, s6, 2], 0].tolist() == [3, 3, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_adds_every_occurrence_of_a_repeated_key(device):
    t = one_bucket(device)
    res = t.insert(
        i64([5, 5, 6, 5], device), policies=[ACCUMULATE], scores=i64([[2], [3], [7], [4]], device)
    )
    assert status_names(res.status) == ["INSERTED", "FOUND", "INSERTED", "FOUND"]
    assert res.slots.tolist() == [0, 0, 1, 0]
    assert t.scores[:2, 0].tolist() == [9, 7]
    assert t.counter("INSERTS").tolist() == [2]
    t.insert_and_evict(i64([6, 6], device), policies=[ACCUMULATE], scores=i64([[1]], device))
    assert int(t.scores[1, 0]) == 9
    t.find(
        i64([5, 6, 5, 99], device),
        policies=[ACCUMULATE],
        scores=i64([[10], [1], [100], [5]], device),
        update=True,
    )
    assert t.scores[:2, 0].tolist() == [119, 10]


@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_in_a_parallel_find_loses_no_update(device):
    t = ScoredHashTable([1024], bucket_capacities=16, device=device)
    t.insert(i64([1, 2, 3], device))
    n = 30000  # well above the CPU grain: several threads add to one slot
    keys = torch.tensor([1, 2, 3], device=device).repeat(n)
    slots = t.find(keys, policies=[ACCUMULATE], scores=i64([[1]], device), update=True)
    assert slots.reshape(n, 3).unique(dim=0).shape[0] == 1
    s = t.find(i64([1, 2, 3], device))
    assert t.scores[s, 0].tolist() == [n, n, n]


@pytest.mark.parametrize("device", DEVICES)
def test_policy_none_starts_new_keys_at_zero_and_keeps_resident_scores(device):
    t = one_bucket(device, num_scores=2)
    t.insert(i64([5], device), policies=[ASSIGN, ASSIGN], scores=i64([[4, 8]], device))
    res = t.insert(i64([5, 6], device), policies=[NONE, ASSIGN], scores=i64([[1, 2]], device))
    assert t.scores[res.slots, :].tolist() == [[4, 2], [0, 2]]
    t.find(i64([5, 6], device), policies=[NONE, NONE], scores=i64([[7, 7]], device), update=True)
    assert t.scores[res.slots, :].tolist() == [[4, 2], [0, 2]]


@pytest.mark.parametrize("device", DEVICES)
def test_timer_score_is_one_clock_reading_per_batch_and_monotonic(device):
    t = ScoredHashTable([256], bucket_capacities=16, device=device)
    t0 = time.monotonic_ns()
    r1 = t.insert(i64(range(40), device), policies=[TIMER])
    t1 = time.monotonic_ns()
    time.sleep(0.002)
    r2 = t.insert(i64(range(40, 80), device), policies=[TIMER])
    ok1 = r1.slots[r1.slots >= 0]
    ok2 = r2.slots[r2.slots >= 0]
    ts1 = t.scores[ok1, 0].unique().tolist()
    ts2 = t.scores[ok2, 0].unique().tolist()
    assert len(ts1) == 1 and len(ts2) == 1
    assert ts2[0] > ts1[0]
    if device == "cpu":  # the CPU timer is the host's monotonic clock
        assert t0 <= ts1[0] <= t1


# ----------------------------------------------------------- NO_EVICTION --


@pytest.mark.parametrize("device", DEVICES)
def test_no_eviction_hands_out_rows_in_order_and_never_evicts(device):
    t = one_bucket(device, no_eviction=True)
    keys = [100 + i for i in range(16)]
    res = t.insert(i64(keys, device))
    assert t.rows(res.slots).tolist() == list(range(16))
    res = t.insert_and_evict(i64([7, 105], device), scores=i64([[-50]], device))
    assert status_names(res.status) == ["FAILED", "FOUND"]
    assert int(res.evicted.count) == 0
    assert t.counter("EVICTIONS").tolist() == [0]
    assert t.counter("INSERT_FAILURES").tolist() == [1]
    assert t.counter("NEXT_ROW").tolist() == [16]
    # find with update never touches the row word.
    t.find(i64(keys, device), policies=[ASSIGN], scores=i64([[77]], device), update=True)
    assert t.rows(t.find(i64(keys, device))).tolist() == list(range(16))


@pytest.mark.parametrize("device", DEVICES)
def test_no_eviction_rows_follow_batch_order_across_buckets(device):
    t = ScoredHashTable([64], bucket_capacities=16, no_eviction=True, device=device)
    # Keys whose buckets are in decreasing order: batch order, not bucket order, gives rows.
    keys = [keys_in_bucket(64, 16, b, 1, start=1000)[0] for b in (3, 1, 2, 0)]
    res = t.insert(i64(keys, device))
    assert t.rows(res.slots).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_no_eviction_reuses_erased_rows_top_of_stack_first(device):
    t = ScoredHashTable([64], bucket_capacities=None, no_eviction=True, device=device)
    keys = [100 + i for i in range(10)]
    t.insert(i64(keys, device))
    assert t.erase(i64([107, 999, 103], device)).tolist() == [True, False, True]
    assert t.counter("FREE_TOP").tolist() == [2]
    assert t.free_rows[:2].tolist() == [7, 3]  # pushed in batch order
    res = t.insert(i64([500, 501, 502], device))
    assert t.rows(res.slots).tolist() == [3, 7, 10]  # top first, then a fresh row
    assert t.counter("FREE_TOP").tolist() == [0]
    assert t.counter("NEXT_ROW").tolist() == [11]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
def test_no_eviction_key_without_a_row_is_not_stored(device):
    t = one_bucket(device, capacity=32, no_eviction=True, row_capacities=2)
    res = t.insert(i64([5, 6, 7], device))
    assert status_names(res.status) == ["INSERTED", "INSERTED", "FAILED"]
    assert res.slots.tolist()[2] == -1
    assert t.rows(res.slots).tolist() == [0, 1, -1]
    assert t.find(i64([7], device)).tolist() == [-1]
    assert t.size().tolist() == [2] and t.count().tolist() == [2]
    assert t.counter("INSERT_FAILURES").tolist() == [1]
    assert t.counter("INSERTS").tolist() == [2]
    assert t.counter("NEXT_ROW").tolist() == [2]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
def test_no_eviction_repeat_of_rowless_key_is_not_reported_found(device):
    """A repeat of a key that got no row must not be handed the slot the key
    gave back (its row word would alias another key's row)."""
    t = one_bucket(device, capacity=32, no_eviction=True, row_capacities=1)
    res = t.insert(i64([5, 7, 7], device))
    assert status_names(res.status) == ["INSERTED", "FAILED", "FAILED"]
    assert res.slots.tolist() == [0, -1, -1]
    assert t.rows(res.slots).tolist() == [0, -1, -1]
    assert t.find(i64([7], device)).tolist() == [-1]
    assert t.size().tolist() == [1]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
def test_no_eviction_assign_rows_takes_rows_from_score_column_zero(device):
    t = one_bucket(device, capacity=32, no_eviction=True, row_capacities=40)
    res = t.insert(i64([5, 6], device), scores=i64([[30], [2]], device), assign_rows=True)
    assert t.rows(res.slots).tolist() == [30, 2]
    # The allocator is rebuilt from the rows held: rows 0..29 but 2 are free.
    assert t.counter("NEXT_ROW").tolist() == [31]
    assert t.counter("FREE_TOP").tolist() == [29]
    assert t.rows(t.insert(i64([7, 8], device)).slots).tolist() == [0, 1]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
def test_erase_removes_keys_and_reports_absent_ones(device):
    t = ScoredHashTable([32, 64], bucket_capacities=16, device=device)
    t.insert(i64([1, 2, 3, 1], device), i64([0, 0, 0, 1], device))
    got = t.erase(i64([2, 1, 1, 9], device), i64([0, 1, 1, 0], device))
    assert got.tolist() == [True, True, False, False]
    assert t.find(i64([1, 2, 3, 1], device), i64([0, 0, 0, 1], device)).ge(0).tolist() == [
        True,
        False,
        True,
        False,
    ]
    assert t.size().tolist() == [2, 0]
    assert t.count().tolist() == [2, 0]
    lo = t.find(i64([1, 3], device), i64([0, 0], device))
    assert t.digests[lo].tolist() == [M.digest_of(1), M.digest_of(3)]
    assert int((t.keys == M.EMPTY_KEY).sum()) == 96 - 2
    assert (t.digests[t.keys == M.EMPTY_KEY] == M.EMPTY_DIGEST).all()
    assert not t.scores[t.keys == M.EMPTY_KEY].any()


# ------------------------------------------------------------ expansion --


def _populated(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = ScoredHashTable(
        [64, 128],
        bucket_capacities=[16, None],
        num_scores=2,
        max_capacities=[512, 512],
        device=device,
    )
    keys = torch.randint(-(2**62), 2**62, (150,), generator=g)
    tids = torch.randint(0, 2, (150,), generator=g)
    vals = torch.randint(0, 100, (150, 2), generator=g)
    t.insert(keys.to(device), tids.to(device), policies=[ASSIGN, ASSIGN], scores=vals.to(device))
    return t


def _contents(t):
    e = t.export_batch().compact()
    return sorted(zip(e.table_ids.tolist(), e.keys.tolist(), map(tuple, e.scores.tolist())))


@pytest.mark.parametrize("device", DEVICES)
def test_relayout_keeps_every_key_and_score_and_maps_slots_consistently(device):
    t = _populated(device)
    before = _contents(t)
    old_keys, old_scores = t.keys.clone(), t.scores.clone()
    counters = t.counters.clone()
    assert len(before) > 60
    old, new = t.relayout([256, 512])
    assert (t.capacity(0), t.capacity(1), t.bucket_capacity(1)) == (256, 512, 512)
    assert _contents(t) == before
    assert sorted(old.tolist()) == old.tolist() and len(old) == len(before)
    assert torch.equal(t.keys[new], old_keys[old])
    assert torch.equal(t.scores[new], old_scores[old])
    e = t.export_batch().compact()
    assert torch.equal(t.find(e.keys, e.table_ids), e.slots)
    assert torch.equal(t.counters, counters)
    for tid in (0, 1):  # each key in its table's new slot range and home bucket
        lo, hi = t.slot_range(tid)
        w = t.bucket_capacity(tid)
        for k, s in zip(e.keys[e.table_ids == tid].tolist(), e.slots[e.table_ids == tid].tolist()):
            b = (M.bucket_hash(k) % t.capacity(tid)) // w
            assert lo + b * w <= s < lo + (b + 1) * w <= hi


@pytest.mark.parametrize("device", DEVICES)
def test_reserve_grows_tables_past_the_load_factor_and_keeps_keys(device):
    t = _populated(device)
    before = _contents(t)
    sizes = t.size().tolist()
    incoming = [200, 0]
    expected = []
    for cap, size, inc in zip([64, 128], sizes, incoming):
        while size + inc > 0.5 * cap and cap < 512:
            cap *= 2
        expected.append(cap)
    assert expected[0] >= 512 and sizes[1] > 64  # both grow
    out = t.reserve(incoming)
    assert out is not None
    assert [t.capacity(0), t.capacity(1)] == expected
    assert t.bucket_capacity(1) == expected[1]  # one bucket spans the table
    assert _contents(t) == before
    assert t.reserve([0, 0]) is None


@pytest.mark.parametrize("device", DEVICES)
def test_relayout_that_cannot_place_a_key_fails_and_changes_nothing(device):
    t = _populated(device)
    snap = snapshot(t)
    with pytest.raises(RuntimeError, match="could not place key"):
        t.relayout([16, 128])
    assert_same_snapshot(snap, snapshot(t))
    t.insert(i64([12345], device), i64([0], device))  # still usable


@pytest.mark.parametrize("device", DEVICES)
def test_relayout_of_no_eviction_table_keeps_rows_and_free_stack(device):
    t = ScoredHashTable(
        [32], bucket_capacities=16, no_eviction=True, max_capacities=[256], device=device
    )
    keys = list(range(100, 112))
    res = t.insert(i64(keys, device))
    rows = dict(zip(keys, t.rows(res.slots).tolist()))
    t.erase(i64([104, 101], device))
    stack = t.free_rows[:2].tolist()
    t.relayout([128], [64])
    assert t.row_capacity(0) == 64
    assert t.counter("FREE_TOP").tolist() == [2] and t.free_rows[:2].tolist() == stack
    live = [k for k in keys if k not in (104, 101)]
    assert t.rows(t.find(i64(live, device))).tolist() == [rows[k] for k in live]
    res = t.insert(i64([900], device))
    assert t.rows(res.slots).tolist() == [rows[101]]
    assert_rows_consistent(t)


# --------------------------------------------------------- fused layouts --


@pytest.mark.parametrize("device", DEVICES)
def test_fused_tables_with_different_capacities_and_widths(device):
    caps, widths = [48, 64, 128], [None, 16, 32]
    t = ScoredHashTable(caps, bucket_capacities=widths, device=device)
    m = M.TableModel(caps, bucket_capacities=widths)
    assert [t.slot_range(i) for i in range(3)] == [(0, 48), (48, 112), (112, 240)]
    assert t.total_buckets == 1 + 4 + 4
    keys = [1, 2, 3, 1000, -5, 2**40]
    for tid in range(3):
        res = t.insert(i64(keys, device), i64([tid] * len(keys), device))
        exp = m.insert(keys, [tid] * len(keys))
        assert res.slots.tolist() == exp.slots
        lo, hi = t.slot_range(tid)
        assert all(lo <= s < hi for s in res.slots.tolist())
    # The same key in three tables: three slots, one per table.
    s = t.find(i64([1, 1, 1], device), i64([0, 1, 2], device)).tolist()
    assert len(set(s)) == 3
    # The one-bucket table fills positions in batch order.
    assert t.find(i64(keys, device), i64([0] * 6, device)).tolist() == list(range(6))
    assert t.count().tolist() == [6, 6, 6]
    assert_matches_model(t, m)


@pytest.mark.parametrize("device", DEVICES)
def test_single_bucket_table_of_non_power_of_two_capacity(device):
    t = ScoredHashTable([48], bucket_capacities=None, device=device)
    keys = [10 * i for i in range(48)]
    res = t.insert(i64(keys, device))
    assert res.slots.tolist() == list(range(48))
    res = t.insert(i64([7], device))
    assert status_names(res.status) == ["FAILED"]
    res = t.insert_and_evict(i64([7], device), scores=i64([[1]], device))
    assert res.slots.tolist() == [0]  # all scores 0: lowest position


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batches_change_nothing_and_return_empty_outputs(device):
    t = ScoredHashTable(
        [32, 64], bucket_capacities=16, num_scores=2, no_eviction=[False, True], device=device
    )
    t.insert(i64([1, 2], device), i64([0, 1], device))
    snap = snapshot(t)
    e = i64([], device)
    assert t.find(e, e).shape == (0,)
    for call in (t.insert, t.insert_and_evict):
        res = call(e, e, policies=[ASSIGN, ACCUMULATE], scores=i64([[1, 2]], device))
        assert res.slots.shape == (0,) and res.status.shape == (0,)
        assert res.status.dtype == torch.int8
        assert res.evicted.scores.shape == (0, 2)
        assert int(res.evicted.count) == 0
        res = call(e, e, policies=[ASSIGN, ASSIGN], scores=i64([], device).reshape(0, 2))
        assert res.slots.shape == (0,)
    assert t.erase(e, e).shape == (0,)
    assert_same_snapshot(snap, snapshot(t))


# ------------------------------------------------------ values lookups --


def _mixed_table(device):
    """Table 0 evicting (values by slot), table 1 NO_EVICTION (values by row)."""
    t = ScoredHashTable([32, 64], bucket_capacities=16, no_eviction=[False, True], device=device)
    t.insert(
        i64([1, 2, 3], device), i64([0, 0, 0], device), policies=[ASSIGN], scores=i64([[5]], device)
    )
    t.insert(i64([1, 7, 8], device), i64([1, 1, 1], device))
    t.erase(i64([7], device), i64([1], device))
    t.insert(i64([9], device), i64([1], device))  # reuses row 1
    return t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_find_gather_copies_the_row_of_each_found_key_and_zeros_for_absent(device, dtype):
    t = _mixed_table(device)
    values = (torch.arange(96 * 3).reshape(96, 3) * 10).to(dtype).to(device)
    keys, tids = [1, 2, 99, 1, 8, 9, 7, 3], [0, 0, 0, 1, 1, 1, 1, 0]
    slots, rows = t.find_gather(i64(keys, device), values, i64(tids, device))
    assert torch.equal(slots, t.find(i64(keys, device), i64(tids, device)))
    # table 1 rows: 1 -> 0, 8 -> 2, 9 -> 1 (7's row, reused); 7 is gone.
    row_of = {(1, 1): 0, (8, 1): 2, (9, 1): 1}
    expected = []
    for k, tid, s in zip(keys, tids, slots.tolist()):
        if s < 0:
            expected.append(torch.zeros(3, dtype=dtype))
        else:
            r = s if tid == 0 else row_of[(k, tid)]
            expected.append(values[r].cpu())
    assert rows.dtype == dtype and rows.shape == (len(keys), 3)
    assert torch.equal(rows.cpu(), torch.stack(expected))
    assert [s >= 0 for s in slots.tolist()] == [True, True, False, True, True, True, False, True]


@pytest.mark.parametrize("device", DEVICES)
def test_find_gather_with_update_applies_the_policies_like_find(device):
    a, b = _mixed_table(device), _mixed_table(device)
    values = torch.zeros(96, 2, device=device)
    keys, tids = i64([1, 2, 1, 8], device), i64([0, 0, 0, 1], device)
    args = dict(policies=[ACCUMULATE], scores=i64([[1], [2], [4], [8]], device), update=True)
    a.find_gather(keys, values, tids, **args)
    b.find(keys, tids, **args)
    assert torch.equal(a.scores, b.scores)
    assert a.scores[a.find(i64([1], device), i64([0], device)), 0].tolist() == [10]


@pytest.mark.parametrize("device", DEVICES)
def test_find_gather_refuses_a_value_buffer_too_small_for_a_found_key(device):
    """A found key whose row lies past the value buffer must not come back as
    a zero row next to a valid slot (as gather_rows refuses such a row)."""
    t = ScoredHashTable([64], bucket_capacities=None, device=device)
    t.insert(i64(range(20), device))  # slots 0..19
    values = torch.ones(10, 4, device=device)
    if device == "cpu":
        with pytest.raises(ValueError, match=r"1[0-9]"):
            t.find_gather(i64([3, 15], device), values)
        return
    # The CUDA kernel does not synchronize to raise: the row past the buffer
    # reads as zeros (documented in cc/table/table_cuda.h).
    slots, rows = t.find_gather(i64([3, 15], device), values)
    assert rows[1].abs().sum().item() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rows_copies_rows_and_zeros_for_minus_one(device):
    values = torch.arange(20, dtype=torch.float32, device=device).reshape(5, 4)
    out = OPS.gather_rows(values, i64([4, -1, 0, 4], device))
    exp = torch.stack([values[4], torch.zeros(4, device=device), values[0], values[4]])
    assert torch.equal(out, exp)
    assert OPS.gather_rows(values, i64([], device)).shape == (0, 4)
    for bad, idx in ((5, 1), (-2, 1)):
        if device == "cpu":
            with pytest.raises(ValueError, match=rf"row {bad} at index {idx}"):
                OPS.gather_rows(values, i64([0, bad], device))
        else:  # no synchronizing check on CUDA: rows out of range read as zeros
            assert OPS.gather_rows(values, i64([0, bad], device))[1].abs().sum().item() == 0
    with pytest.raises(ValueError, match="contiguous"):
        OPS.gather_rows(values.t(), i64([0], device))


# ---------------------------------------------------------------- export --


@pytest.mark.parametrize("device", DEVICES)
def test_export_selects_by_threshold_column_and_slot_range(device):
    t = ScoredHashTable([16, 32], bucket_capacities=[None, None], num_scores=2, device=device)
    fill0 = [(1, (5, 100)), (2, (1, 200)), (3, (9, 50))]
    fill1 = [(10, (4, 10)), (11, (6, 20)), (12, (5, 30)), (13, (0, 40))]
    for tid, rows in ((0, fill0), (1, fill1)):
        t.insert(
            i64([k for k, _ in rows], device),
            i64([tid] * len(rows), device),
            policies=[ASSIGN, ASSIGN],
            scores=i64([list(s) for _, s in rows], device),
        )
    # slots: table 0 at 0..2, table 1 at 16..19
    allrec = [
        (1, 0, 0, (5, 100)),
        (2, 1, 0, (1, 200)),
        (3, 2, 0, (9, 50)),
        (10, 16, 1, (4, 10)),
        (11, 17, 1, (6, 20)),
        (12, 18, 1, (5, 30)),
        (13, 19, 1, (0, 40)),
    ]
    assert exported_records(t.export_batch()) == allrec
    assert exported_records(t.export_batch(score_column=0, threshold=5)) == [
        r for r in allrec if r[3][0] >= 5
    ]
    assert exported_records(t.export_batch(score_column=1, threshold=40)) == [
        r for r in allrec if r[3][1] >= 40
    ]
    assert exported_records(t.export_batch(1, 18)) == allrec[1:5]
    assert exported_records(t.export_batch(2, 17, score_column=1, threshold=15)) == [allrec[2]]
    assert int(t.export_batch(3, 16).count) == 0
    assert int(t.export_batch(5, 5).count) == 0
    assert int(t.export_batch(0, 48, threshold=2**63 - 1).count) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_export_output_past_the_count_is_deterministic(device):
    """The tail of every export output past `count` must not be uninitialized
    memory (torch.compile compares outputs elementwise; see opcheck)."""
    t = ScoredHashTable([64], bucket_capacities=16, device=device)
    t.insert(i64([1, 2, 3], device))
    outs = []
    for _ in range(3):
        junk = torch.full((1 << 16,), 12345, dtype=torch.int64, device=device)  # recycle memory
        del junk
        outs.append(OPS.table_export(t.keys, t.scores, t.info, 0, 64, 0, M.EMPTY_KEY))
    for a, b in zip(outs[0], outs[1]):
        assert torch.equal(a, b)
    for a, b in zip(outs[0], outs[2]):
        assert torch.equal(a, b)


# --------------------------------------------- threads and large batches --


def test_results_do_not_depend_on_the_thread_count():
    def run(threads):
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            t = ScoredHashTable(
                [8192, 4096], bucket_capacities=[16, 32], max_capacities=[8192, 4096]
            )
            g = torch.Generator().manual_seed(3)
            outs = []
            for _ in range(3):
                keys = torch.randint(0, 20000, (12000,), generator=g)
                tids = torch.randint(0, 2, (12000,), generator=g)
                vals = torch.randint(0, 50, (12000, 1), generator=g)
                r = t.insert_and_evict(keys, tids, policies=[ACCUMULATE], scores=vals)
                outs += [r.slots, r.status, *evicted_records(r)]
            return outs, t.keys.clone(), t.scores.clone(), t.counters.clone()
        finally:
            torch.set_num_threads(prev)

    a, b = run(1), run(max(2, torch.get_num_threads()))
    assert all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a[0], b[0])
    )
    for x, y in zip(a[1:], b[1:]):
        assert torch.equal(x, y)


def test_large_batch_with_two_radix_passes_matches_the_model():
    """4096 + 512 buckets: the bucket sort needs two 11-bit passes."""
    caps, widths = [65536, 8192], [16, 16]
    t = ScoredHashTable(caps, bucket_capacities=widths)
    m = M.TableModel(caps, bucket_capacities=widths)
    g = torch.Generator().manual_seed(11)
    for _ in range(2):
        keys = torch.randint(-(2**63) + 4, 2**63 - 1, (5000,), generator=g)
        keys[2500:] = keys[:2500] % 9000  # repeats and collisions
        tids = torch.randint(0, 2, (5000,), generator=g)
        vals = torch.randint(0, 9, (5000, 1), generator=g)
        r = t.insert_and_evict(keys, tids, policies=[ACCUMULATE], scores=vals)
        e = m.insert_and_evict(keys.tolist(), tids.tolist(), [ACCUMULATE], vals.tolist())
        assert r.slots.tolist() == e.slots
        assert evicted_records(r) == e.evicted
    assert_matches_model(t, m)


# --------------------------------------------------------------- opcheck --

OPCHECK_UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_static",
    "test_aot_dispatch_dynamic",
)


def _opcheck_cases(device):
    t = ScoredHashTable(
        [32, 64], bucket_capacities=16, num_scores=2, no_eviction=[False, True], device=device
    )
    t.insert(
        i64(range(40), device),
        i64([i % 2 for i in range(40)], device),
        policies=[ASSIGN, ASSIGN],
        scores=i64([[3, 4]], device),
    )
    t.erase(i64([1, 3], device), i64([1, 1], device))
    keys, tids = i64(range(30, 50), device), i64([i % 2 for i in range(20)], device)
    vals = i64([[1, 2]], device)

    def state():
        return (t.keys.clone(), t.digests.clone(), t.scores.clone())

    def run(op, assign_rows=False, values=vals):
        k, d, s = state()
        return (
            keys,
            tids,
            k,
            d,
            s,
            t.info,
            t.counters.clone(),
            t.free_rows.clone(),
            [ACCUMULATE, ASSIGN],
            values,
            op,
            assign_rows,
            t.total_buckets,
            True,
        )

    k, d, s = state()
    values = torch.randn(96, 8, device=device)
    return {
        "find": (
            OPS.table_find.default,
            (keys, tids, k, d, s, t.info, [ACCUMULATE, TIMER], vals, False),
        ),
        "find_update": (
            OPS.table_find.default,
            (keys, tids, k, d, s.clone(), t.info, [ACCUMULATE, ASSIGN], vals, True),
        ),
        "insert": (OPS.table_run.default, run(M.OP_INSERT)),
        "insert_evict": (OPS.table_run.default, run(M.OP_INSERT_EVICT)),
        "insert_assign_rows": (
            OPS.table_run.default,
            run(M.OP_INSERT, True, i64([[20 + i, 0] for i in range(20)], device)),
        ),
        "erase": (OPS.table_run.default, run(M.OP_ERASE)),
        "export": (OPS.table_export.default, (t.keys, t.scores, t.info, 0, 96, 0, 0)),
        "export_range": (OPS.table_export.default, (t.keys, t.scores, t.info, 10, 70, 1, 4)),
        "count": (OPS.table_count.default, (t.keys, t.info)),
        "find_gather": (
            OPS.table_find_gather.default,
            (keys, tids, k, d, s.clone(), t.info, [ACCUMULATE, ASSIGN], vals, True, values),
        ),
        "gather_rows": (OPS.gather_rows.default, (values, i64([3, -1, 0, 95, 3], device))),
        "home_starts": (OPS.table_home_starts.default, (keys, tids, t.keys, t.info)),
        "check_rows": (
            OPS.table_check_rows.default,
            (
                keys,
                tids,
                t.keys,
                t.digests,
                t.scores,
                t.info,
                t.free_rows,
                i64([[20 + i, 0] for i in range(20)], device),
            ),
        ),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("test_util", OPCHECK_UTILS)
@pytest.mark.parametrize(
    "case",
    [
        "find",
        "find_update",
        "insert",
        "insert_evict",
        "insert_assign_rows",
        "erase",
        "export",
        "export_range",
        "count",
        "find_gather",
        "gather_rows",
        "home_starts",
        "check_rows",
    ],
)
def test_opcheck(case, test_util, device):
    op, args = _opcheck_cases(device)[case]
    torch.library.opcheck(op, args, test_utils=test_util)


def _ops_without_a_kernel(dispatch_key: str) -> list[str]:
    from dynamicemb.table import ops

    ops()  # loads the extension
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("dynamicemb::")]
    assert names, "no dynamicemb op is registered"
    return sorted(
        n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(n, dispatch_key)
    )


@pytest.mark.parametrize("dispatch_key", ["CPU", "Meta"])
def test_every_op_has_a_cpu_and_a_meta_kernel(dispatch_key):
    assert _ops_without_a_kernel(dispatch_key) == []


@pytest.mark.gpu
def test_every_op_has_a_cuda_kernel():
    """A CUDA build registers a CUDA kernel of every op (tools/check_ops.py
    checks the sources the same way)."""
    assert _ops_without_a_kernel("CUDA") == []


@pytest.mark.parametrize("device", DEVICES)
def test_timer_opcheck(device):
    """The clock's reading changes from call to call: its schema, fake kernel
    and autograd registration, not its value."""
    torch.library.opcheck(
        OPS.table_timer.default,
        (torch.zeros(1, device=device),),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )

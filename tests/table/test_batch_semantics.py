"""What a batch may and may not do to the keys it brings, with the smallest
cases that once went wrong:

* a key already in the table when the call starts is found, keeps its slot
  (and so its trained row), and is never evicted by a new key of the same
  batch, whatever their order in the batch;
* LFU (ACCUMULATE) scores saturate at the int64 bounds instead of wrapping.
"""

import pytest
import torch

from dynamicemb.table import ScoredHashTable
from tests.devices import DEVICES
from tests.table import table_model as M
from tests.table.table_testlib import evicted_records, i64, status_names

ASSIGN, ACCUMULATE, TIMER = M.ASSIGN, M.ACCUMULATE, M.TIMER
INT64_MAX, INT64_MIN = M.INT64_MAX, M.INT64_MIN


@pytest.mark.parametrize("device", DEVICES)
def test_resident_key_that_is_the_victim_is_found_before_a_new_key_evicts(device):
    # Found: a full 16-slot bucket with LRU ties; batch [new key 1, resident B]
    # where B is the bucket's victim. B was evicted by key 1, then re-inserted
    # as new (EVICTED, another slot), its trained row replaced by a fresh one.
    t = ScoredHashTable([16], bucket_capacities=16, device=device)
    t.insert(i64(range(100, 116), device), policies=[TIMER])  # one timestamp: all tie
    b = int(t.keys[0])  # lowest position: the victim of a tie
    assert b == 100
    res = t.insert_and_evict(i64([1, b], device), policies=[TIMER])
    assert status_names(res.status) == ["EVICTED", "FOUND"]
    assert res.slots.tolist() == [1, 0]
    assert [r[0] for r in evicted_records(res)] == [101]
    assert t.find(i64([b, 1], device)).tolist() == [0, 1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["new_first", "resident_first", "interleaved"])
def test_no_resident_key_of_a_batch_is_evicted_by_that_batch(device, order):
    t = ScoredHashTable([16], bucket_capacities=16, device=device)
    resident = list(range(100, 116))
    t.insert(i64(resident, device), policies=[ASSIGN], scores=i64([[s] for s in range(16)], device))
    new = list(range(200, 216))
    old = resident[:8]  # the eight lowest scores: the first victims
    batch = {
        "new_first": new + old,
        "resident_first": old + new,
        "interleaved": [k for pair in zip(new, old + old) for k in pair],
    }[order]
    slots_before = t.find(i64(old, device)).tolist()
    res = t.insert_and_evict(i64(batch, device), policies=[ASSIGN], scores=i64([[50]], device))
    st = dict(zip(batch, status_names(res.status)))
    sl = dict(zip(batch, res.slots.tolist()))
    for k, s in zip(old, slots_before):
        assert st[k] == "FOUND" and sl[k] == s, k
    evicted = [r[0] for r in evicted_records(res)]
    assert not set(evicted) & set(old)
    # The 8 untouched residents are evicted, lowest score first; the other 8
    # new keys find only slots this batch holds.
    assert evicted == resident[8:]
    assert sorted(status_names(res.status)).count("FAILED") == 8


def _zipf_batches(steps, batch, vocab, exponent, seed):
    g = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** exponent
    for _ in range(steps):
        yield torch.multinomial(p, batch, replacement=False, generator=g) + 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", [TIMER, ACCUMULATE, ASSIGN], ids=["lru", "lfu", "step"])
def test_zipf_stream_never_loses_a_resident_key_of_the_batch(device, policy):
    # Found: 60 steps of 256 distinct ids out of 50K, capacity 1024, bucket
    # 128, LRU: 55 of 5,515 lookups of resident keys were evicted and
    # re-inserted by their own batch.
    t = ScoredHashTable([1024], bucket_capacities=128, device=device)
    residents_seen = 0
    for step, ids in enumerate(_zipf_batches(60, 256, 50_000, 1.05, seed=7)):
        keys = ids.to(device)
        before = t.find(keys)
        scores = i64([[step]], device) if policy == ASSIGN else None
        if policy == ACCUMULATE:
            scores = torch.ones(keys.numel(), 1, dtype=torch.int64, device=device)
        res = t.insert_and_evict(keys, policies=[policy], scores=scores)
        resident = before >= 0
        residents_seen += int(resident.sum())
        status = res.status.cpu()
        assert (status[resident.cpu()] == M.FOUND).all(), f"step {step}"
        assert torch.equal(res.slots[resident], before[resident]), f"step {step}"
        evicted = res.evicted.compact().keys
        assert not bool(torch.isin(evicted, keys).any()), f"step {step}: a batch key was evicted"
    assert residents_seen > 3000  # the stream keeps a hot set resident


# --------------------------------------------------------- LFU saturation --


@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_saturates_at_int64_max_instead_of_wrapping(device):
    # Found: a key at INT64_MAX plus one became INT64_MIN.
    t = ScoredHashTable([16], bucket_capacities=16, device=device)
    t.insert(i64([7, 8], device), policies=[ASSIGN], scores=i64([[INT64_MAX - 1], [5]], device))
    t.find(i64([7], device), policies=[ACCUMULATE], scores=1, update=True)
    t.find(i64([7], device), policies=[ACCUMULATE], scores=1, update=True)  # past the bound
    slots = t.find(i64([7, 8], device))
    assert t.scores[slots, 0].tolist() == [INT64_MAX, 5]
    # The same through insert (resident keys accumulate in the run).
    t.insert_and_evict(i64([7, 7], device), policies=[ACCUMULATE], scores=i64([[3]], device))
    assert int(t.scores[slots[0], 0]) == INT64_MAX
    # A saturated key ranks above every other (a wrapped one would be evicted first).
    t.insert(i64(range(20, 34), device), policies=[ACCUMULATE], scores=1)
    res = t.insert_and_evict(i64([99], device), policies=[ACCUMULATE], scores=1)
    assert [r[0] for r in evicted_records(res)] == [20]


@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_saturates_at_int64_min_for_negative_counts(device):
    t = ScoredHashTable([16], bucket_capacities=16, device=device)
    t.insert(i64([7], device), policies=[ASSIGN], scores=i64([[INT64_MIN + 4]], device))
    t.find(i64([7, 7], device), policies=[ACCUMULATE], scores=-3, update=True)
    assert int(t.scores[t.find(i64([7], device)), 0]) == INT64_MIN

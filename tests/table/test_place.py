"""place: keys written at given slots of their home buckets (the table op
replays use), against the pure-Python model: random batches over evicting and
NO_EVICTION tables, displaced occupants, keys moving within their bucket, and
refused input changing nothing."""

import random

import pytest
import torch

from dynamicemb.table import ScoredHashTable, enums
from tests.devices import DEVICES
from tests.table import table_model as M
from tests.table.table_testlib import (
    assert_matches_model,
    assert_rows_consistent,
    assert_same_snapshot,
    evicted_records,
    i64,
    snapshot,
    status_names,
)

ASSIGN = [int(enums.ScorePolicy.ASSIGN)]


def _random_batch(rng, model, n, key_range):
    """n distinct (key, table) pairs with distinct slots in their home buckets."""
    keys, tids, slots, used = [], [], [], set()
    while len(keys) < n:
        t = rng.randrange(model.num_tables)
        k = rng.randrange(*key_range)
        if (k, t) in zip(keys, tids):
            continue
        start, w, _ = model.home(t, k)
        s = start + rng.randrange(w)
        if s in used:
            continue
        used.add(s)
        keys.append(k)
        tids.append(t)
        slots.append(s)
    return keys, tids, slots


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_place_matches_the_model_over_random_batches(device, seed):
    rng = random.Random(seed)
    caps, width = [64, 128], 16
    table = ScoredHashTable(caps, bucket_capacities=width, device=device)
    model = M.TableModel(caps, bucket_capacities=width)
    for step in range(8):
        if step % 3 == 0:  # ordinary inserts in between: places meet resident keys
            keys = [rng.randrange(0, 300) for _ in range(20)]
            tids = [rng.randrange(2) for _ in keys]
            vals = [[step]]
            res = table.insert_and_evict(
                i64(keys, device), i64(tids, device), ASSIGN, torch.tensor(vals)
            )
            want = model.insert_and_evict(keys, tids, ASSIGN, vals)
            assert res.slots.cpu().tolist() == want.slots
        keys, tids, slots = _random_batch(rng, model, 24, (0, 300))
        vals = [[100 * step + i] for i in range(len(keys))]
        res = table.place(
            i64(keys, device), i64(slots, device), i64(tids, device), ASSIGN, torch.tensor(vals)
        )
        want = model.place(keys, tids, slots, ASSIGN, vals)
        assert res.slots.cpu().tolist() == want.slots == slots
        assert [int(s) for s in res.status.cpu()] == want.status
        assert evicted_records(res) == want.evicted
        assert_matches_model(table, model)


@pytest.mark.parametrize("device", DEVICES)
def test_place_displaces_the_occupant_and_moves_a_key_within_its_bucket(device):
    table = ScoredHashTable([64], bucket_capacities=16, device=device)
    a, b = 5, 6
    ra = table.insert(i64([a], device), policies=ASSIGN, scores=torch.tensor([[1]]))
    sa = int(ra.slots[0])
    start = int(table.home_starts(i64([a], device))[0])
    # b into a's slot (b's home bucket may differ: pick a key sharing it).
    b = next(k for k in range(7, 10_000) if int(table.home_starts(i64([k], device))[0]) == start)
    res = table.place(
        i64([b], device), i64([sa], device), policies=ASSIGN, scores=torch.tensor([[2]])
    )
    assert status_names(res.status) == ["EVICTED"]
    assert evicted_records(res) == [(a, (1,), sa, 0)]
    assert table.find(i64([a, b], device)).cpu().tolist() == [-1, sa]
    # b moves to another slot of the bucket: one copy, size unchanged.
    other = start + (sa - start + 1) % 16
    res = table.place(
        i64([b], device), i64([other], device), policies=ASSIGN, scores=torch.tensor([[3]])
    )
    assert status_names(res.status) == ["INSERTED"]
    assert table.find(i64([b], device)).cpu().tolist() == [other]
    assert table.size().cpu().tolist() == [1]
    assert int(table.counter("EVICTIONS")[0]) == 1
    # placing it where it is: FOUND, the score assigned.
    res = table.place(
        i64([b], device), i64([other], device), policies=ASSIGN, scores=torch.tensor([[4]])
    )
    assert status_names(res.status) == ["FOUND"]
    assert int(table.scores[other, 0]) == 4


@pytest.mark.parametrize("device", DEVICES)
def test_place_no_eviction_rows_leave_the_allocator(device):
    table = ScoredHashTable(
        [64], bucket_capacities=16, no_eviction=True, row_capacities=32, device=device
    )
    model = M.TableModel([64], bucket_capacities=16, no_eviction=True, row_capacities=32)
    res = table.insert(i64([1, 2, 3], device))
    model.insert([1, 2, 3], [0, 0, 0])
    table.erase(i64([2], device), i64([0], device))
    model.erase([2], [0])
    # 10 takes row 1 (on the stack); 11 takes row 7 (past NEXT_ROW = 3).
    keys, rows = [10, 11], [1, 7]
    slots = [model.home(0, k)[0] + 15 - i for i, k in enumerate(keys)]
    res = table.place(
        i64(keys, device),
        i64(slots, device),
        i64([0, 0], device),
        scores=torch.tensor([[r] for r in rows]),
        assign_rows=True,
    )
    model.place(keys, [0, 0], slots, values=[[r] for r in rows], assign_rows=True)
    assert status_names(res.status) == ["INSERTED", "INSERTED"]
    assert_matches_model(table, model)
    assert_rows_consistent(table)
    # The next insert gets a row nobody holds.
    res = table.insert(i64([12], device))
    model.insert([12], [0])
    assert_matches_model(table, model)
    assert_rows_consistent(table)


@pytest.mark.parametrize("device", DEVICES)
def test_refused_places_change_nothing(device):
    table = ScoredHashTable([64], bucket_capacities=16, device=device)
    table.insert(i64(range(1, 30), device))
    before = snapshot(table)
    start = int(table.home_starts(i64([100], device))[0])
    outside = (start + 16) % 64
    with pytest.raises(ValueError, match="not in its home bucket"):
        table.place(i64([100], device), i64([outside], device))
    with pytest.raises(ValueError, match="key twice"):
        table.place(i64([100, 100], device), i64([start, start + 1], device))
    with pytest.raises(ValueError, match="slot twice"):
        k2 = next(
            k for k in range(101, 10_000) if int(table.home_starts(i64([k], device))[0]) == start
        )
        table.place(i64([100, k2], device), i64([start, start], device))
    with pytest.raises(ValueError, match="reserved"):
        table.place(i64([M.EMPTY_KEY], device), i64([0], device))
    assert_same_snapshot(before, snapshot(table))


def _raw_place(table, keys, targets):
    """table_run with op PLACE, without the Python layer's checks."""
    from dynamicemb.table._native import ops

    return ops().table_run(
        keys,
        torch.zeros_like(keys),
        table.keys,
        table.digests,
        table.scores,
        table.info,
        table.counters,
        table.free_rows,
        [0],
        torch.zeros(1, 1, dtype=torch.int64),
        int(enums.RunOp.PLACE),
        False,
        table.total_buckets,
        False,
        None,
        targets,
    )


def test_cpu_kernel_refuses_a_slot_outside_the_home_bucket():
    """The op itself checks, not only the Python layer."""
    table = ScoredHashTable([64], bucket_capacities=16)
    start = int(table.home_starts(i64([100]))[0])
    before = snapshot(table)
    with pytest.raises(ValueError, match="home bucket"):
        _raw_place(table, i64([100]), i64([(start + 16) % 64]))
    with pytest.raises(ValueError, match="target_slots"):
        _raw_place(table, i64([100]), None)
    assert_same_snapshot(before, snapshot(table))

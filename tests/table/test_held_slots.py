"""insert_and_evict with held slots (cc/table/operations.h, "Held slots"):
the slots a call holds from its start are never its victims, and the call's
other results are those of the same call with the held slots' keys first in
its batch, their score words assigned as they are (the cache's prefetch held
its slots that way before). Against that re-insert on the same table, on
random tables with full buckets of several widths, one or two score words,
victim scores, repeats and keys already stored; CUDA also against the CPU,
under both run kernels (a tile per run, a thread per run)."""

import pytest
import torch

from dynamicemb.table import ScoredHashTable, enums
from tests.devices import DEVICES
from tests.table.table_testlib import assert_same_snapshot, i64, raw_run, snapshot

ASSIGN, ACCUMULATE = 1, 2
STATE = ("keys", "digests", "scores", "counters", "free_rows", "info")


def _table(device, num_scores, seed):
    """Three tables of 16-, 128- and 1,024-slot buckets, filled past their
    capacity (every bucket full), scores with ties."""
    g = torch.Generator().manual_seed(seed)
    t = ScoredHashTable(
        [16 * 8, 128 * 4, 1024 * 2],
        bucket_capacities=[16, 128, 1024],
        num_scores=num_scores,
        device=device,
    )
    for _ in range(3):
        n = 6000
        keys = torch.randint(1, 40000, (n,), generator=g)
        tids = torch.randint(0, 3, (n,), generator=g)
        scores = torch.randint(0, 6, (n, num_scores), generator=g)
        t.insert_and_evict(
            keys.to(device), tids.to(device), [ASSIGN] * num_scores, scores.to(device)
        )
    return t


def _batch(t, g, held_share):
    """A batch of new keys, some stored ones and repeats; a mask holding
    ``held_share`` of the stored slots (and a few empty ones)."""
    n = 3000
    keys = torch.randint(1, 60000, (n,), generator=g)
    tids = torch.randint(0, 3, (n,), generator=g)
    scores = torch.randint(0, 6, (n, t.num_scores), generator=g)
    mask = torch.rand(t.num_slots, generator=g) < held_share
    return keys, tids, scores, mask


def _clone(t, device):
    c = ScoredHashTable(
        [16 * 8, 128 * 4, 1024 * 2],
        bucket_capacities=[16, 128, 1024],
        num_scores=t.num_scores,
        device=device,
    )
    for name in STATE:
        getattr(c, name).copy_(getattr(t, name))
    return c


def _with_held(t, keys, tids, policies, scores, mask, vs):
    d = t.keys.device
    return t.insert_and_evict(
        keys.to(d),
        tids.to(d),
        policies,
        scores.to(d),
        victim_scores=None if vs is None else vs.to(d),
        held_slots=mask.to(d),
    )


def _reinserted(t, keys, tids, policies, scores, mask, vs):
    """The same call with the held slots' stored keys first, their score
    words assigned as they are; the results of the batch's own keys."""
    d = t.keys.device
    slots = mask.nonzero().squeeze(1).to(d)
    slots = slots[t.keys[slots] >= 0]  # empty held slots hold nothing (keys here are > 0)
    hk = t.keys[slots]
    ht = torch.searchsorted(
        torch.tensor([t.slot_range(i)[1] for i in range(t.num_tables)], device=d),
        slots,
        right=True,
    )
    hs = t.scores[slots]
    h = hk.numel()
    # Held keys assign their own words; the batch's keys keep their policies:
    # one call takes one policy a column, so the batch's ACCUMULATE column adds
    # zero to the held keys' words.
    add = [p == ACCUMULATE for p in policies]
    hs_in = torch.where(torch.tensor(add, device=d).unsqueeze(0), torch.zeros_like(hs), hs)
    res = t.insert_and_evict(
        torch.cat([hk, keys.to(d)]),
        torch.cat([ht, tids.to(d)]),
        policies,
        torch.cat([hs_in, scores.to(d)]),
        victim_scores=None if vs is None else vs.to(d),
    )
    assert (res.status[:h] == enums.InsertStatus.FOUND).all()
    return res.slots[h:], res.status[h:], res.evicted.compact()


def _same_state(a, b, what):
    for name in STATE:
        x, y = getattr(a, name).cpu(), getattr(b, name).cpu()
        assert torch.equal(x, y), f"{what}: {name} differs in {int((x != y).sum())} entries"


def _evicted_set(ev):
    rows = torch.cat(
        [ev.keys.cpu().unsqueeze(1), ev.table_ids.cpu().unsqueeze(1), ev.slots.cpu().unsqueeze(1)],
        1,
    )
    return sorted(map(tuple, rows.tolist()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_scores", [1, 2])
@pytest.mark.parametrize("victim", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_held_slots_give_the_results_of_reinserting_their_keys(
    device, num_scores, victim, accumulate
):
    g = torch.Generator().manual_seed(num_scores * 4 + victim * 2 + accumulate)
    a = _table(device, num_scores, seed=num_scores)
    b = _clone(a, device)
    policies = [ACCUMULATE if accumulate and c == 0 else ASSIGN for c in range(num_scores)]
    held_total = 0
    for step, share in enumerate([0.0, 0.3, 0.7, 1.0]):
        keys, tids, scores, mask = _batch(a, g, share)
        vs = torch.randint(0, 4, (a.num_slots,), generator=g).double() if victim else None
        held_keys = a.keys.cpu()[mask]
        held_keys = held_keys[held_keys >= 0]
        ra = _with_held(a, keys, tids, policies, scores, mask, vs)
        slots, status, ev = _reinserted(b, keys, tids, policies, scores, mask, vs)
        what = f"step {step}, held share {share}"
        assert torch.equal(ra.slots.cpu(), slots.cpu()), f"{what}: slots"
        assert torch.equal(ra.status.cpu(), status.cpu()), f"{what}: statuses"
        evicted = _evicted_set(ra.evicted.compact())
        assert evicted == _evicted_set(ev), f"{what}: evicted"
        _same_state(a, b, what)
        # No held slot lost its key.
        gone = [s for _, _, s in evicted if mask[s]]
        assert not gone, f"{what}: held slots evicted: {gone[:5]}"
        held_total += held_keys.numel()
        if share == 1.0:
            # Every stored slot held: a new key takes only an empty slot.
            assert not evicted
            assert (ra.status == enums.InsertStatus.FAILED).any()
    assert held_total > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_full_bucket_evicts_its_unheld_slots_in_victim_order_then_fails(device):
    t = ScoredHashTable([16], bucket_capacities=None, num_scores=1, device=device)
    t.insert(i64(range(100, 116), device), policies=[ASSIGN], scores=i64(range(16), device))
    assert t.find(i64(range(100, 116), device)).cpu().tolist() == list(range(16))
    mask = torch.zeros(16, dtype=torch.bool, device=device)
    mask[[0, 1, 2, 3, 4, 5, 9, 12]] = True
    before = int(t.counters[0, enums.CounterCol.INSERT_FAILURES])
    res = t.insert_and_evict(
        i64(range(1, 11), device), policies=[ASSIGN], scores=[99], held_slots=mask
    )
    ev = res.evicted.compact()
    assert sorted(ev.keys.cpu().tolist()) == [106, 107, 108, 110, 111, 113, 114, 115]
    assert (
        res.status.cpu().tolist()
        == [enums.InsertStatus.EVICTED] * 8 + [enums.InsertStatus.FAILED] * 2
    )
    assert t.find(i64([100, 101, 102, 103, 104, 105, 109, 112], device)).cpu().tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
        9,
        12,
    ]
    assert int(t.counters[0, enums.CounterCol.INSERT_FAILURES]) == before + 2


def test_bad_held_slots_are_refused_and_change_nothing():
    t = ScoredHashTable([32], bucket_capacities=None, num_scores=1)
    t.insert(i64(range(100, 132)), policies=[ASSIGN], scores=i64(range(32)))
    before = snapshot(t)
    u8, b8 = torch.uint8, torch.bool
    bad = [
        (TypeError, "held_slots", lambda: t.insert_and_evict(i64([200]), held_slots=i64([0] * 32))),
        (
            ValueError,
            r"one entry per slot \(32\), got shape \(31,\)",
            lambda: t.insert_and_evict(i64([200]), held_slots=torch.zeros(31, dtype=b8)),
        ),
        (
            ValueError,
            r"held_slots must be a contiguous \(32\) tensor",
            lambda: raw_run(t, [200], 1, held_slots=torch.zeros(16, dtype=u8)),
        ),
        (
            ValueError,
            r"8-byte aligned",
            lambda: raw_run(t, [200], 1, held_slots=torch.zeros(33, dtype=u8)[1:]),
        ),
        (
            ValueError,
            r"insert and insert_and_evict \(op 0 or 1\), got op 2",
            lambda: raw_run(t, [200], 2, held_slots=torch.zeros(32, dtype=u8)),
        ),
        (
            TypeError,
            r"uint8 or bool, got Float",
            lambda: raw_run(t, [200], 1, held_slots=torch.zeros(32, dtype=torch.float32)),
        ),
    ]
    for error, match, call in bad:
        with pytest.raises(error, match=match):
            call()
    assert_same_snapshot(before, snapshot(t))
    # A view at an odd offset is copied by the table, not refused.
    mask = torch.zeros(33, dtype=torch.bool)[1:]
    mask[:8] = True
    res = t.insert_and_evict(i64([200]), policies=[ASSIGN], scores=[99], held_slots=mask)
    assert res.evicted.compact().keys.tolist() == [108]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("num_scores", [1, 2])
def test_cuda_held_slots_match_the_cpu(num_scores):
    g = torch.Generator().manual_seed(7 + num_scores)
    a = _table("cpu", num_scores, seed=num_scores)
    b = _clone(a, "cuda")
    policies = [ASSIGN] * num_scores
    for share in [0.2, 0.6, 0.95]:
        keys, tids, scores, mask = _batch(a, g, share)
        vs = torch.randint(0, 4, (a.num_slots,), generator=g).double()
        ra = _with_held(a, keys, tids, policies, scores, mask, vs)
        rb = _with_held(b, keys, tids, policies, scores, mask, vs)
        assert torch.equal(ra.slots, rb.slots.cpu()), f"share {share}: slots"
        assert torch.equal(ra.status, rb.status.cpu()), f"share {share}: statuses"
        ea, eb = ra.evicted.compact(), rb.evicted.compact()
        for name in ("keys", "scores", "slots", "table_ids"):
            assert torch.equal(getattr(ea, name), getattr(eb, name).cpu()), f"evicted {name}"
        _same_state(a, b, f"share {share}")


@pytest.mark.parametrize("device", DEVICES)
def test_slot_mask_marks_the_given_slots_and_skips_minus_one(device):
    t = ScoredHashTable([32], bucket_capacities=None, num_scores=1, device=device)
    mask = t.slot_mask(i64([3, -1, 7, 3], device), i64([], device), i64([31, -1], device))
    assert mask.shape == (32,) and mask.dtype == torch.bool
    assert mask.nonzero().squeeze(1).cpu().tolist() == [3, 7, 31]
    assert not t.slot_mask().any()

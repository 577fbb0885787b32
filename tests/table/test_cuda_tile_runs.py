"""The CUDA backend's runs of insert and insert_and_evict (a tile of lanes per
bucket run, cc/table/tile_run.h) compute what the CPU backend computes, in the
cases the tiles treat apart: full buckets, runs longer than a tile and than
the bucket, repeated keys within and across a tile's chunks of keys, ties in
the score words, two score words, victim scores, refused cold newcomers
(refuse_cold: the victim stays for the run's next key), NO_EVICTION tables, buckets of
16 to 1,024 slots next to one wider than a tile takes (run a thread per run) in
the same call, and the same batch twice (the results do not depend on the run).

Run under each DEMB_CUDA_RUN_LANES (4, 8, 16, 32; 1 the earlier kernel) by
tools/bench/gpu_round.sh evict_tests.
"""

import pytest
import torch

from dynamicemb.table import ScoredHashTable, enums

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

P = enums.ScorePolicy if torch.cuda.is_available() else None
STATE = ("keys", "digests", "scores", "counters", "free_rows", "info")


def _pair(**kw):
    return ScoredHashTable(device="cpu", **kw), ScoredHashTable(device="cuda", **kw)


def _same(a, b, ra, rb, what):
    assert torch.equal(ra.slots, rb.slots.cpu()), f"{what}: slots differ"
    assert torch.equal(ra.status, rb.status.cpu()), f"{what}: statuses differ"
    ea, eb = ra.evicted.compact(), rb.evicted.compact()
    for name in ("keys", "scores", "slots", "table_ids"):
        assert torch.equal(getattr(ea, name), getattr(eb, name).cpu()), f"{what}: evicted {name}"
    for name in STATE:
        x, y = getattr(a, name), getattr(b, name).cpu()
        assert torch.equal(x, y), f"{what}: {name} differs in {int((x != y).sum())} entries"


def _run(a, b, op, keys, tables, policies, scores, victim_scores=None, what="", refuse=False):
    evict = op == "insert_and_evict" and victim_scores is not None
    kw = {"victim_scores": victim_scores} if evict else {}
    if op == "insert_and_evict" and refuse:
        kw["refuse_cold"] = True
    ra = getattr(a, op)(keys, tables, policies, scores, **kw)
    if evict:
        kw["victim_scores"] = victim_scores.cuda()
    sc = scores.cuda() if isinstance(scores, torch.Tensor) else scores
    rb = getattr(b, op)(keys.cuda(), tables.cuda(), policies, sc, **kw)
    _same(a, b, ra, rb, what)
    return ra


def _stored(t, table):
    lo, hi = t.slot_range(table)
    k = t.keys[lo:hi]
    return k[k >= 0]


# Widths a tile keeps in its masks (16 to 1,024 slots), and one bucket of
# 2,048 slots spanning its table (a thread per run, after a prefind).
WIDTHS = [16, 48, 128, 256, 1024, None]
CAPS = [16 * 6, 48 * 4, 128 * 4, 256 * 2, 1024 * 2, 2048]


@pytest.mark.parametrize("refuse", [False, True])
@pytest.mark.parametrize("num_scores", [1, 2])
@pytest.mark.parametrize("victim", [False, True])
def test_full_buckets_of_every_width_with_long_runs_and_repeats_match_cpu(
    num_scores, victim, refuse
):
    """Every table full after the first batches; then batches of resident and
    new keys whose runs are longer than a tile and than their bucket, with
    repeats near and far apart, few distinct score values (ties), with
    `victim`, victim scores with ties and NaNs, and with `refuse`,
    insert_and_evict's refuse_cold (a refused key's repeats are refused or
    placed like it, later keys take the victim it left)."""
    a, b = _pair(capacities=CAPS, bucket_capacities=WIDTHS, num_scores=num_scores)
    g = torch.Generator().manual_seed(17 + num_scores + 2 * victim)
    refused = 0
    pol = [P.ASSIGN] + [P.ACCUMULATE] * (num_scores - 1)
    nt = len(CAPS)
    for step in range(8):
        parts = []
        for t in range(nt):
            stored = _stored(a, t)
            pick = torch.randint(0, max(1, stored.numel()), (CAPS[t] // 4,), generator=g)
            old = stored[pick] if stored.numel() else stored
            new = torch.randint(0, 10**12, (CAPS[t] * 3 // 2,), generator=g)
            keys = torch.cat([old, new, new[::7], new[::13]])
            parts.append((keys, torch.full_like(keys, t)))
        keys = torch.cat([k for k, _ in parts])
        tables = torch.cat([t for _, t in parts])
        perm = torch.randperm(keys.numel(), generator=g)
        keys, tables = keys[perm], tables[perm]
        scores = torch.randint(0, 3, (keys.numel(), num_scores), generator=g, dtype=torch.int64)
        vs = None
        if victim:
            vs = torch.randint(0, 2, (a.num_slots,), generator=g).double()
            vs[torch.randint(0, a.num_slots, (40,), generator=g)] = float("nan")
        op = "insert" if step == 5 else "insert_and_evict"
        r = _run(a, b, op, keys, tables, pol, scores, vs, what=f"step {step}", refuse=refuse)
        refused += int((r.status == enums.InsertStatus.REFUSED).sum())
    assert a.size().tolist() == CAPS  # full: new keys evicted, failed or refused
    assert (refused > 0) == refuse


def test_ties_evict_the_lowest_slots_first_like_cpu():
    """One score value everywhere: the victims are the lowest untouched slots,
    in slot order, one run of 3,000 keys into a full 1,024-slot bucket and
    runs of every length into 128-slot buckets."""
    a, b = _pair(capacities=[1024, 128 * 8], bucket_capacities=[1024, 128])
    g = torch.Generator().manual_seed(5)
    for step in range(4):
        keys = torch.randint(0, 10**12, (3000,), generator=g)
        tables = (torch.arange(3000) % 3 == 0).long()
        _run(a, b, "insert_and_evict", keys, tables, [P.ASSIGN], 7, what=f"step {step}")


def test_timer_scores_and_same_batch_twice_match_cpu():
    """TIMESTAMP-like scores (one clock reading per call on each backend, so
    the calls tie among themselves) and the same batch twice: every key of
    the second call is found or placed again, never evicted by its own batch."""
    a, b = _pair(capacities=[128 * 16, 1024 * 2], bucket_capacities=[128, 1024], num_scores=2)
    g = torch.Generator().manual_seed(9)
    pol = [P.ACCUMULATE, P.ASSIGN]
    for step in range(5):
        keys = torch.randint(0, 2000 + 3000 * step, (4000,), generator=g)
        tables = torch.randint(0, 2, (4000,), generator=g)
        scores = torch.randint(0, 4, (4000, 2), generator=g)
        _run(a, b, "insert_and_evict", keys, tables, pol, scores, what=f"step {step}")
        _run(a, b, "insert_and_evict", keys, tables, pol, scores, what=f"step {step} again")
    a2, b2 = _pair(capacities=[128 * 4], bucket_capacities=[128])
    for _ in range(3):
        keys = torch.randint(0, 10**9, (900,), generator=g)
        ra = a2.insert_and_evict(keys, None, [P.TIMER])
        rb = b2.insert_and_evict(keys.cuda(), None, [P.TIMER])
        assert torch.equal(ra.slots, rb.slots.cpu()) and torch.equal(ra.status, rb.status.cpu())
        assert torch.equal(a2.keys, b2.keys.cpu())


def test_no_eviction_full_buckets_and_repeats_match_cpu():
    """NO_EVICTION tables next to an evicting one: full buckets fail their new
    keys (insert_and_evict too), repeats find the slot their first occurrence
    took, the row pass hands out rows in batch order."""
    kw = dict(
        capacities=[128 * 2, 1024, 48 * 2],
        bucket_capacities=[128, 1024, 48],
        no_eviction=[True, True, False],
        row_capacities=[300, 1100, None],
        validate=False,
    )
    a, b = _pair(**kw)
    g = torch.Generator().manual_seed(11)
    for step in range(6):
        keys = torch.randint(0, 3000, (1500,), generator=g)
        tables = torch.randint(0, 3, (1500,), generator=g)
        op = "insert" if step % 2 else "insert_and_evict"
        _run(a, b, op, keys, tables, [P.ASSIGN], step, what=f"step {step}")
        erase = torch.randint(0, 3000, (200,), generator=g)
        et = torch.randint(0, 3, (200,), generator=g)
        assert torch.equal(a.erase(erase, et), b.erase(erase.cuda(), et.cuda()).cpu())


def test_deterministic_from_run_to_run():
    """The same calls on two CUDA tables give the same bits."""
    tables = [ScoredHashTable([1024 * 4, 128 * 64], [1024, 128], device="cuda") for _ in range(2)]
    g = torch.Generator().manual_seed(13)
    batches = [torch.randint(0, 10**6, (20000,), generator=g) for _ in range(4)]
    ids = [torch.randint(0, 2, (20000,), generator=g) for _ in range(4)]
    out = []
    for t in tables:
        res = [
            t.insert_and_evict(k.cuda(), i.cuda(), [P.ACCUMULATE], 1) for k, i in zip(batches, ids)
        ]
        out.append((res, [getattr(t, n).clone() for n in STATE]))
    (r0, s0), (r1, s1) = out
    for x, y in zip(r0, r1):
        assert torch.equal(x.slots, y.slots) and torch.equal(x.status, y.status)
        assert torch.equal(x.evicted.compact().keys, y.evicted.compact().keys)
    for x, y in zip(s0, s1):
        assert torch.equal(x, y)

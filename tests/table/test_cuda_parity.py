"""The CUDA backend computes what the CPU backend computes.

Every operation runs on a CPU table and a CUDA table side by side; after each
step both hold identical keys, digests, scores, counters and free rows, and the
calls returned identical slots, statuses and eviction records. The batch
semantics (cc/table/operations.h) are deterministic, so slots agree too, with or
without DEMB_DETERMINISM_MODE.
"""

import os

import pytest
import torch

from dynamicemb.table import ScoredHashTable, enums

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

P = enums.ScorePolicy if torch.cuda.is_available() else None


def _pair(**kw):
    return ScoredHashTable(device="cpu", **kw), ScoredHashTable(device="cuda", **kw)


def _assert_same_state(a: ScoredHashTable, b: ScoredHashTable) -> None:
    for name in ("keys", "digests", "scores", "counters", "free_rows", "info"):
        x, y = getattr(a, name), getattr(b, name).cpu()
        assert torch.equal(x, y), f"{name} differs: {int((x != y).sum())} entries"


def _assert_same_result(ra, rb) -> None:
    assert torch.equal(ra.slots, rb.slots.cpu()), "slots differ"
    assert torch.equal(ra.status, rb.status.cpu()), "statuses differ"
    ea, eb = ra.evicted.compact(), rb.evicted.compact()
    for name in ("keys", "scores", "slots", "table_ids"):
        assert torch.equal(getattr(ea, name), getattr(eb, name).cpu()), f"evicted {name} differ"


def _step(a, b, op, keys, tables, policies=None, scores=None):
    ra = getattr(a, op)(keys, tables, policies, scores)
    rb = getattr(b, op)(
        keys.cuda(),
        tables.cuda(),
        policies,
        scores.cuda() if isinstance(scores, torch.Tensor) else scores,
    )
    _assert_same_result(ra, rb)
    _assert_same_state(a, b)
    return ra


def _random_batch(g, n, key_range, num_tables, num_scores):
    keys = torch.randint(0, key_range, (n,), generator=g, dtype=torch.int64)
    tables = torch.randint(0, num_tables, (n,), generator=g, dtype=torch.int64)
    scores = torch.randint(0, 5, (n, num_scores), generator=g, dtype=torch.int64)
    return keys, tables, scores


@pytest.mark.parametrize("num_scores", [1, 2])
def test_random_batches_match_cpu(num_scores):
    g = torch.Generator().manual_seed(1)
    kw = dict(
        capacities=[1024, 4096, 512], bucket_capacities=[16, 128, None], num_scores=num_scores
    )
    a, b = _pair(**kw)
    pol = [P.ACCUMULATE] * num_scores
    for step in range(8):
        keys, tables, scores = _random_batch(g, 3000, 20000, 3, num_scores)
        op = "insert_and_evict" if step % 3 else "insert"
        _step(a, b, op, keys, tables, pol, scores)
        found_a = a.find(keys, tables, pol, scores, update=True)
        found_b = b.find(keys.cuda(), tables.cuda(), pol, scores.cuda(), update=True)
        assert torch.equal(found_a, found_b.cpu())
        _assert_same_state(a, b)
    erase_keys, erase_tables, _ = _random_batch(g, 2000, 20000, 3, num_scores)
    assert torch.equal(
        a.erase(erase_keys, erase_tables), b.erase(erase_keys.cuda(), erase_tables.cuda()).cpu()
    )
    _assert_same_state(a, b)
    ea, eb = (
        a.export_batch(0, a.num_slots, 0, 3).compact(),
        b.export_batch(0, b.num_slots, 0, 3).compact(),
    )
    for name in ("keys", "slots", "table_ids", "scores"):
        assert torch.equal(getattr(ea, name), getattr(eb, name).cpu())
    assert torch.equal(a.count(), b.count().cpu())


def test_all_keys_in_one_bucket_and_duplicates_match_cpu():
    a, b = _pair(capacities=[64], bucket_capacities=[64])
    keys = torch.tensor([5, 9, 5, 5, 11] * 20 + list(range(100, 180)), dtype=torch.int64)
    scores = torch.arange(keys.numel(), dtype=torch.int64).reshape(-1, 1) % 7
    tables = torch.zeros_like(keys)
    _step(a, b, "insert_and_evict", keys, tables, [P.ASSIGN], scores)
    _step(a, b, "insert_and_evict", keys.flip(0) + 1000, tables, [P.ASSIGN], scores)


def test_load_factor_one_and_empty_batches_match_cpu():
    a, b = _pair(capacities=[2048], bucket_capacities=[128])
    g = torch.Generator().manual_seed(3)
    empty = torch.empty(0, dtype=torch.int64)
    _step(a, b, "insert_and_evict", empty, empty, [P.ASSIGN], 1)
    for step in range(6):
        keys = torch.randint(0, 10**12, (2048,), generator=g, dtype=torch.int64)
        _step(a, b, "insert_and_evict", keys, torch.zeros_like(keys), [P.ASSIGN], step)
    assert int(a.size()[0]) == 2048


@pytest.mark.parametrize("num_scores", [1, 2])
def test_full_buckets_with_found_and_new_keys_match_cpu(num_scores):
    """Full buckets whose runs hold found keys and one or more new keys (the
    CUDA backend's victim hints and its in-run scans), with and without victim
    scores (ties and a NaN among them), two tables of different widths."""
    a, b = _pair(capacities=[2048, 512], bucket_capacities=[128, 16], num_scores=num_scores)
    g = torch.Generator().manual_seed(7)
    pol = [P.ACCUMULATE] + [P.ASSIGN] * (num_scores - 1)
    for step in range(10):
        stored = a.keys[a.keys >= 0]
        old = (
            stored[torch.randint(0, stored.numel(), (400,), generator=g)]
            if stored.numel()
            else stored
        )
        new = torch.randint(0, 10**12, (1600,), generator=g, dtype=torch.int64)
        keys = torch.cat([old, new, new[:100]])
        keys = keys[torch.randperm(keys.numel(), generator=g)]
        tables = (keys % 5 == 0).long()  # about a fifth to the narrow table
        scores = torch.randint(0, 4, (keys.numel(), num_scores), generator=g, dtype=torch.int64)
        vs = None
        if step % 2:
            vs = torch.randint(0, 3, (a.num_slots,), generator=g).double()
            vs[torch.randint(0, a.num_slots, (20,), generator=g)] = float("nan")
        ra = a.insert_and_evict(keys, tables, pol, scores, victim_scores=vs)
        rb = b.insert_and_evict(
            keys.cuda(),
            tables.cuda(),
            pol,
            scores.cuda(),
            victim_scores=None if vs is None else vs.cuda(),
        )
        _assert_same_result(ra, rb)
        _assert_same_state(a, b)
    assert a.size().tolist() == [2048, 512]  # full: every new key evicts


def test_no_eviction_rows_match_cpu():
    kw = dict(
        capacities=[256, 256],
        bucket_capacities=16,
        no_eviction=[True, False],
        row_capacities=[100, None],
    )
    a, b = _pair(**kw)
    g = torch.Generator().manual_seed(4)
    for step in range(5):
        keys, tables, _ = _random_batch(g, 150, 400, 2, 1)
        _step(a, b, "insert", keys, tables, [P.ASSIGN], step)
        ek, et, _ = _random_batch(g, 60, 400, 2, 1)
        assert torch.equal(a.erase(ek, et), b.erase(ek.cuda(), et.cuda()).cpu())
        _assert_same_state(a, b)


def test_relayout_matches_cpu():
    kw = dict(capacities=[256, 512], bucket_capacities=32, max_capacities=[4096, 4096])
    a, b = _pair(**kw)
    g = torch.Generator().manual_seed(5)
    keys, tables, scores = _random_batch(g, 300, 10**9, 2, 1)
    _step(a, b, "insert", keys, tables, [P.ASSIGN], scores)
    ma, mb = a.reserve([1000, 1000]), b.reserve([1000, 1000])
    assert torch.equal(ma[0], mb[0].cpu()) and torch.equal(ma[1], mb[1].cpu())
    _assert_same_state(a, b)


def test_large_batch_over_several_tables_matches_cpu():
    """DEMB_PARITY_KEYS keys (default 2**22) over four tables at load factor 1."""
    total = int(os.environ.get("DEMB_PARITY_KEYS", str(1 << 22)))
    caps = [total // 8, total // 8, total // 16, total // 16]
    caps = [max(128, c // 128 * 128) for c in caps]
    a, b = _pair(capacities=caps, bucket_capacities=128)
    g = torch.Generator().manual_seed(6)
    batch = 1 << 22
    done = 0
    while done < total:
        n = min(batch, total - done)
        keys = torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64)
        tables = torch.randint(0, 4, (n,), generator=g, dtype=torch.int64)
        ra = a.insert_and_evict(keys, tables, [P.ASSIGN], done)
        rb = b.insert_and_evict(keys.cuda(), tables.cuda(), [P.ASSIGN], done)
        _assert_same_result(ra, rb)
        done += n
    _assert_same_state(a, b)


def test_one_wide_bucket_with_long_runs_matches_cpu():
    """One bucket of 4,096 slots and batches of 3,000 keys: the CPU looks the
    run up through its hash index and selects many victims at once; the GPU
    probes per key. Resident keys, new keys, repeats and victim scores mixed."""
    a, b = _pair(capacities=[4096], bucket_capacities=None, num_scores=2)
    g = torch.Generator().manual_seed(7)
    for step in range(6):
        keys, tables, scores = _random_batch(g, 3000, 9000, 1, 2)
        vs = torch.randn(4096, generator=g, dtype=torch.float64)
        vs[torch.randint(0, 4096, (50,), generator=g)] = float("nan")
        pol = [P.ACCUMULATE, P.ASSIGN]
        ra = a.insert_and_evict(keys, tables, pol, scores, victim_scores=vs if step % 2 else None)
        rb = b.insert_and_evict(
            keys.cuda(),
            tables.cuda(),
            pol,
            scores.cuda(),
            victim_scores=vs.cuda() if step % 2 else None,
        )
        _assert_same_result(ra, rb)
        _assert_same_state(a, b)


def test_assigned_rows_rebuild_the_allocators_like_cpu():
    kw = dict(
        capacities=[128, 256], bucket_capacities=16, no_eviction=True, row_capacities=[60, 90]
    )
    a, b = _pair(**kw)
    g = torch.Generator().manual_seed(8)
    # Distinct free rows with gaps, then the allocator hands out the gaps first.
    keys = torch.randperm(10**6, generator=g)[:70] + 1
    tables = (torch.arange(70) % 2).to(torch.int64)
    rows = torch.cat([torch.randperm(60, generator=g)[:35], torch.randperm(90, generator=g)[:35]])
    rows = torch.stack([rows[:35], rows[35:]], 1).reshape(-1, 1)
    ra = a.insert(keys, tables, [P.ASSIGN], rows, assign_rows=True)
    rb = b.insert(keys.cuda(), tables.cuda(), [P.ASSIGN], rows.cuda(), assign_rows=True)
    _assert_same_result(ra, rb)
    _assert_same_state(a, b)
    more, mt, _ = _random_batch(g, 80, 10**9, 2, 1)
    _step(a, b, "insert", more + 10**7, mt, [P.NONE], None)

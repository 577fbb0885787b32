"""The inference table's key -> row index (dynamicemb/inference/index.py)
against a dict of its entries: groups of 1 to 64 tables (masks of every
dtype, and the halvings where a group has none or more than 63 tables),
keys that several tables share, negative keys and keys next to the
sentinel, queries of absent keys, of absent (key, table) pairs and of
tables outside the group; after a merge too."""

import pytest
import torch

from dynamicemb.inference.index import Index, entry_bytes, mask_dtype

I64 = torch.iinfo(torch.int64)


def _entries(num_tables: int, n: int, seed: int):
    """``n`` distinct (key, table) pairs, keys from a small range (most held
    by several tables) and a few at the int64 range's ends."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-(n // 3), n // 3, (4 * n,), generator=g)
    keys[:4] = torch.tensor([I64.min + 4, I64.max - 1, I64.max - 2, -1])
    tables = torch.randint(0, num_tables, (4 * n,), generator=g)
    pairs = list(dict.fromkeys(zip(keys.tolist(), tables.tolist())))[:n]
    k = torch.tensor([p[0] for p in pairs])
    t = torch.tensor([p[1] for p in pairs])
    slots = torch.randperm(len(pairs), generator=g)
    return k, t, slots


def _queries(keys, tables, num_tables: int, seed: int):
    """Held pairs, held keys in other tables (some outside the group) and
    keys held nowhere, the sentinel's value among them."""
    g = torch.Generator().manual_seed(seed + 1)
    m = keys.numel()
    pick = torch.randint(0, m, (3 * m,), generator=g)
    qk = torch.cat([keys[pick], torch.tensor([I64.max, I64.min + 4, 10**15])])
    qt = torch.cat([tables[pick], torch.tensor([0, 0, 0])])
    other = torch.rand(qk.numel(), generator=g) < 0.4
    qt = torch.where(other, torch.randint(-2, num_tables + 2, qt.shape, generator=g), qt)
    return qk, qt.to(torch.int32)


def _check(index: Index, want: dict, qk, qt):
    slots, found = index.locate(qk, qt if index.num_tables > 1 else None)
    entry, found2 = index.find(qk, qt if index.num_tables > 1 else None)
    assert torch.equal(found, found2)
    keys, tables, eslots = index.entries()
    for i, (k, t) in enumerate(zip(qk.tolist(), qt.tolist())):
        key = (k, t if index.num_tables > 1 else 0)
        assert bool(found[i]) == (key in want), (k, t)
        if key in want:
            assert int(slots[i]) == want[key], (k, t)
            e = int(entry[i])
            assert (int(keys[e]), int(tables[e]), int(eslots[e])) == (*key, want[key])


@pytest.mark.parametrize("num_tables", [1, 2, 4, 8, 9, 16, 17, 32, 33, 63, 64])
def test_find_and_locate_match_a_dict_of_the_entries(num_tables):
    keys, tables, slots = _entries(num_tables, 3000, num_tables)
    index = Index.build(keys, tables, slots, num_tables)
    dtype = mask_dtype(num_tables)
    assert (index.masks is None) == (dtype is None)
    if dtype is not None:
        assert index.masks.dtype == dtype and index.masks.shape == index.keys.shape
    want = {(k, t): s for k, t, s in zip(keys.tolist(), tables.tolist(), slots.tolist())}
    if num_tables == 1:
        want = {(k, 0): s for (k, _), s in want.items()}
    _check(index, want, *_queries(keys, tables, num_tables, num_tables))
    # A merge: a third of the entries dropped, new pairs (some of dropped
    # keys, some of kept keys in other tables) added.
    drop = torch.zeros(index.size, dtype=torch.bool)
    drop[::3] = True
    old_keys, old_tables, old_slots = index.entries()
    kept = {
        (k, t): s
        for k, t, s, d in zip(
            old_keys.tolist(), old_tables.tolist(), old_slots.tolist(), drop.tolist()
        )
        if not d
    }
    nk, nt, _ = _entries(num_tables, 1500, num_tables + 100)
    add = [(k, t) for k, t in zip(nk.tolist(), nt.tolist()) if (k, t) not in kept]
    ak = torch.tensor([a[0] for a in add])
    at = torch.tensor([a[1] for a in add])
    aslots = torch.arange(10**6, 10**6 + len(add))
    merged = index.merged(drop, ak, at, aslots)
    kept.update(dict(zip(add, aslots.tolist())))
    _check(
        merged,
        kept,
        *_queries(torch.cat([old_keys, ak]), torch.cat([old_tables, at]), num_tables, 7),
    )


def test_masks_cost_their_bytes():
    keys, tables, slots = _entries(4, 1000, 3)
    four = Index.build(keys, tables, slots, 4)
    n = four.size + 1
    assert four.nbytes == n * (8 + 4 + 4 + 1) == n * entry_bytes(4)
    keys, tables, slots = _entries(20, 1000, 4)
    twenty = Index.build(keys, tables, slots, 20)
    assert (
        twenty.nbytes == (twenty.size + 1) * (8 + 4 + 4 + 4) == (twenty.size + 1) * entry_bytes(20)
    )
    wide = Index.build(*_entries(64, 1000, 5), 64)
    assert wide.masks is None and wide.nbytes == (wide.size + 1) * 16 == (
        wide.size + 1
    ) * entry_bytes(64)
    one = Index.build(*_entries(1, 1000, 6), 1)
    assert one.nbytes == (one.size + 1) * 12 == (one.size + 1) * entry_bytes(1)

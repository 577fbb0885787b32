"""The device cache's own operations: prefetch, flush, purge, the overflow of
a batch larger than the cache, the rows checkpoints read over both tiers,
and the keys the last tier evicts."""

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as Score
from dynamicemb import EvictedItemMode
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.embedding.unique import segmented_unique
from tests.devices import DEVICES
from tests.storage.storage_cases import batches, module, rows_of, seen_keys, table_options, train


def _distinct(m, indices, offsets):
    tids = m._occurrence_tables(indices, offsets)
    su = segmented_unique(indices, tids, len(m.table_options))
    return su.keys, su.table_ids


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_brings_the_next_batchs_stored_keys_into_the_cache(device):
    m = module("cache", optimizer="adam", device=device)
    data = batches(12, 2)
    train(m, [(i.to(device), o.to(device)) for i, o in data[:10]], device=device)
    indices, offsets = (x.to(device) for x in data[10])
    out = m(indices, offsets)
    keys, tids = _distinct(m, *(x.to(device) for x in data[11]))
    cache, backing = m.storage.cache, m.storage.backing
    stored = backing.contains(keys, tids) & ~cache.contains(keys, tids)
    held = _distinct(m, indices, offsets)
    held_slots = cache.table.find(*held)
    assert bool((held_slots >= 0).all())
    m.prefetch(*(x.to(device) for x in data[11]))
    # The next batch's stored keys are cached (as many as fit) ...
    assert int(cache.contains(keys[stored], tids[stored]).sum()) > 0
    # ... and the batch in flight keeps its slots until its backward.
    assert torch.equal(cache.table.find(*held), held_slots)
    out.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_skips_the_rows_the_batch_in_flight_updates_in_the_backing_tier(device):
    # A cache of 16 slots: the batch in flight overflows; the keys the cache
    # cannot take are placed in the backing table, whose rows the update
    # writes there: they are not prefetched into the cache before it, and
    # the write-backs of prefetch's victims do not evict them.
    m = module("cache_small", optimizer="sgd", device=device)
    reference = module("device", optimizer="sgd", device=device)
    data = [(i.to(device), o.to(device)) for i, o in batches(3, 2, batch=48)]
    train(reference, data[:2], device=device)
    train(m, data[:1], device=device)
    out = m(*data[1])
    keys, tids, slots = m.storage._overflow
    placed = slots >= 0
    assert int(placed.sum()) > 0
    m.prefetch(*data[1])  # the same keys again
    assert not bool(m.storage.cache.contains(keys[placed], tids[placed]).any())
    assert torch.equal(m.storage.backing.table.find(keys[placed], tids[placed]), slots[placed])
    g = torch.Generator().manual_seed(101)
    out.backward(torch.randn(out.shape, generator=g).to(device))
    assert m.storage._overflow is None
    seen = seen_keys(data[:2], [0, 1])
    for (fg, eg, sg), (fw, ew, sw) in zip(rows_of(m, seen), rows_of(reference, seen)):
        assert bool(fg.all()) and torch.equal(fg, fw)
        assert torch.equal(eg, ew) and torch.equal(sg, sw)


@pytest.mark.parametrize("device", DEVICES)
def test_flush_writes_the_cache_back_and_purge_empties_it(device):
    m = module("cache", optimizer="adam", device=device)
    data = batches(8, 2)
    train(m, [(i.to(device), o.to(device)) for i, o in data], device=device)
    seen = seen_keys(data, [0, 1])
    before = rows_of(m, seen)
    cache, backing = m.storage.cache, m.storage.backing
    cached = cache.table.export_batch().compact()
    assert cached.keys.numel() > 0
    m.flush()
    # The backing table holds the cached rows; the cache keeps them.
    found, rows, _ = backing.fetch(cached.keys, cached.table_ids)
    assert bool(found.all())
    assert torch.equal(rows, cache.read(cached.slots, cached.table_ids))
    assert cache.table.export_batch().compact().keys.numel() == cached.keys.numel()
    m.purge()
    assert cache.table.export_batch().compact().keys.numel() == 0
    # Nothing is lost: every row reads as before.
    for (_, eb, sb), (fa, ea, sa) in zip(before, rows_of(m, seen)):
        assert bool(fa.all()) and torch.equal(ea, eb) and torch.equal(sa, sb)


def test_training_after_purge_continues_like_the_all_device_module():
    reference, m = module("device", optimizer="adam"), module("cache", optimizer="adam")
    data = batches(10, 2)
    want = train(reference, data)
    got = train(m, data[:5])
    m.purge()
    got += train(m, data[5:], first=5)
    assert all(torch.equal(g, w) for g, w in zip(got[5:], want[5:]))


def test_checkpoint_rows_cover_both_tiers_each_key_once():
    m, reference = module("cache", optimizer="adam"), module("device", optimizer="adam")
    data = batches(10, 2)
    train(m, data)
    train(reference, data)
    for t in range(2):
        got = {}
        for rows in m.rows.export_rows(t, 37):
            for k, e, s in zip(rows.keys.tolist(), rows.embeddings, rows.optimizer_state):
                assert k not in got
                got[k] = (e, s)
        want = {
            k: (e, s)
            for rows in reference.rows.export_rows(t, 1 << 20)
            for k, e, s in zip(rows.keys.tolist(), rows.embeddings, rows.optimizer_state)
        }
        assert set(got) == set(want)
        for k, (e, s) in want.items():
            assert torch.equal(got[k][0], e) and torch.equal(got[k][1], s)


def test_imported_rows_replace_cached_copies():
    m = module("cache", optimizer="sgd")
    data = batches(4, 2)
    train(m, data)
    keys = m.storage.cache.table.export_batch().compact()
    k = keys.keys[keys.table_ids == 0][:5]
    assert k.numel() == 5
    emb = torch.full((5, 8), 0.25)
    scores = torch.ones(5, 1, dtype=torch.int64)
    stored = m.rows.import_rows(0, k, scores, emb, None)
    assert bool(stored.all())
    found, rows, _ = m.storage.read_rows(k, torch.zeros_like(k))
    assert bool(found.all()) and torch.equal(rows[:, :8], emb)


@pytest.mark.parametrize("mode", ["host", "cache"])
def test_the_last_tier_records_the_keys_it_evicts(mode):
    # 128 rows (one bucket) under RETAIN_KEY; 700 distinct keys: most leave.
    m = module(mode, dims=(8,), max_capacity=128, evicted_item_mode=EvictedItemMode.RETAIN_KEY)
    data = batches(10, 1, vocab=700)
    train(m, data)
    (evicted,) = m.pop_evicted_keys()
    seen = seen_keys(data, [0])[0]
    held = {int(k) for rows in m.rows.export_rows(0, 1 << 20) for k in rows.keys}
    assert evicted.numel() > 0
    assert set(evicted.tolist()) <= seen
    # A key in the system now may have been evicted earlier and come back;
    # every key seen is held or was evicted.
    assert seen <= held | set(evicted.tolist())
    assert m.pop_evicted_keys()[0].numel() == 0  # read and cleared


def test_a_cache_keeps_no_eviction_rows_by_step():
    options = table_options("cache", (8,), None, max_capacity=64, score_strategy=Score.NO_EVICTION)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    m = BatchedDynamicEmbeddingTablesV2(options, optimizer=EmbOptimType.EXACT_SGD)
    assert m.storage.cache.strategies == (Score.STEP,)
    assert m.storage.backing.no_eviction


def test_cache_hits_and_misses_are_counted_per_table():
    from dynamicemb.storage.stats import StatCol

    m, device_module = module("cache", optimizer="sgd"), module("device", optimizer="sgd")
    assert {StatCol.CACHE_HITS, StatCol.CACHE_MISSES} <= m.stats.fed
    assert StatCol.CACHE_HITS not in device_module.stats.fed
    want = torch.zeros(2, dtype=torch.int64)
    for indices, offsets in batches(6, 2):
        ex = m.storage.cache.table.export_batch().compact()
        cached = set(zip(ex.table_ids.tolist(), ex.keys.tolist()))
        keys, tids = _distinct(m, indices, offsets)
        for t, k in zip(tids.tolist(), keys.tolist()):
            want[t] += (t, k) in cached
        m(indices, offsets).sum().backward()
    c = m.stats.counts
    assert torch.equal(c[:, StatCol.CACHE_HITS], want)
    assert torch.equal(c[:, StatCol.CACHE_HITS] + c[:, StatCol.CACHE_MISSES], c[:, StatCol.LOOKUPS])
    assert int(want.sum()) > 0 and int(c[:, StatCol.CACHE_MISSES].sum()) > 0


@pytest.mark.parametrize("mode", ["cache", "cache_small", "hybrid", "external", "external_cache"])
def test_eval_reads_every_tier_and_changes_nothing(mode):
    reference, m = module("device", optimizer="adam"), module(mode, optimizer="adam")
    data = batches(8, 2)
    train(reference, data)
    train(m, data)
    before = m.storage.sizes()
    reference.eval()
    m.eval()
    with torch.no_grad():
        # Keys trained (cached or not) and keys never seen (the eval initializer).
        for indices, offsets in batches(3, 2, vocab=4000, seed=7):
            assert torch.equal(m(indices, offsets), reference(indices, offsets))
    assert m.storage.sizes() == before


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("prefetch", [False, True], ids=["lookup", "prefetch"])
def test_rows_taken_from_a_full_backing_table_are_never_lost_to_its_victims(device, prefetch):
    # A backing table of one bucket of 128 rows, full and evicting, under a
    # cache of 16: the cache's victims go back into it in the same step that
    # reads the rows of the keys the cache misses, and would evict them first
    # if they were not protected until read.
    m = module("cache_small", dims=(8,), optimizer="adam", max_capacity=128, device=device)
    data = [(i.to(device), o.to(device)) for i, o in batches(14, 1, batch=48, vocab=600)]
    train(m, data[:12], device=device)
    cache, backing = m.storage.cache, m.storage.backing
    assert int(backing.table.size()[0]) == 128  # full
    keys, tids = _distinct(m, *data[12])
    taken = backing.contains(keys, tids) & ~cache.contains(keys, tids)
    k, t = keys[taken], tids[taken]
    assert k.numel() > 8
    _, emb, state = m.storage.read_rows(k, t)
    if prefetch:
        m.prefetch(*data[12])
        assert int(m.storage.prefetched) > 0
    else:
        out = m(*data[12])  # the rows reach the cache (or the staging buffer), not yet updated
    found, emb_now, state_now = m.storage.read_rows(k, t)
    assert bool(found.all())
    assert torch.equal(emb_now, emb) and torch.equal(state_now, state)
    if not prefetch:
        out.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["cache", "cache_small"])
def test_prefetch_while_the_backing_table_grows_trains_like_the_all_device_module(mode, device):
    # A backing table that starts small and grows: a prefetch between a
    # forward and its backward reserves room in it, which moves its rows. The
    # keys the small cache cannot take have rows there that the backward is
    # still to update, so such a prefetch is skipped (the cache of 128 rows,
    # without overflow, prefetches).
    reference = module("device", optimizer="adam", init_capacity=256, device=device)
    m = module(mode, optimizer="adam", init_capacity=256, device=device)
    data = [(i.to(device), o.to(device)) for i, o in batches(12, 2, batch=48)]
    want = train(reference, data, device=device)
    got = train(m, data, prefetch=True, device=device)
    assert m.storage.backing.table.capacity(0) > 256  # it grew
    assert (int(m.storage.overflows) > 0) == (mode == "cache_small")
    assert (int(m.storage.prefetched) > 0) == (mode == "cache")
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), step
    seen = seen_keys(data, [0, 1])
    for (fg, eg, sg), (fw, ew, sw) in zip(rows_of(m, seen), rows_of(reference, seen)):
        assert torch.equal(fg, fw) and torch.equal(eg, ew) and torch.equal(sg, sw)

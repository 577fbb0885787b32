"""Every storage mode trains exactly as the all-device module.

Hybrid (device and host rows), host only, a device cache over a host table
(with and without prefetch, and smaller than a batch), an external storage
with and without cache: 20 steps of SGD and Adam over far more distinct keys
than a cache holds, so keys leave the cache and come back, pooled and
sequence lookups. The outputs of every step and every row (embedding and
optimizer state) at the end are bitwise those of the all-device module.
"""

import pytest
import torch

from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb import DynamicEmbScoreStrategy as Score
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage import CachedStorage, HashTableStorage
from tests.devices import DEVICES
from tests.storage.storage_cases import (
    MODES,
    OPTIMIZERS,
    assert_trains_like_device,
    module,
    replace,
    rows_of,
    seen_keys,
    table_options,
    train,
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("mode", [m for m in MODES if m != "device"])
def test_mode_trains_like_the_all_device_module(mode, optimizer, device):
    m, _, data = assert_trains_like_device(mode, optimizer, Pool.SUM, device, dims=(8, 12))
    if MODES[mode].get("caching"):
        cache = m.storage.cache
        # Far more keys than the cache holds went through it.
        distinct = sum(len(s) for s in seen_keys(data, [0, 1]))
        assert distinct > 4 * cache.table.num_slots
        if not MODES[mode].get("external"):
            assert int(m.storage.backing.dropped) == 0
    if mode == "cache_small":
        assert int(m.storage.overflows) > 0  # batches larger than the cache
    if mode == "cache":
        assert int(m.storage.overflows) == 0
    if mode in ("hybrid", "host"):
        # A split table's rows crossed the bus staged and moved between the
        # tiers; a host table's kernels address its rows in place.
        staged = (int(m.storage.host_reads), int(m.storage.host_writes), int(m.storage.promotions))
        assert all(staged) if mode == "hybrid" else not any(staged), staged


@pytest.mark.parametrize("mode", ["hybrid", "cache", "cache_small", "external"])
def test_sequence_lookups_train_like_the_all_device_module(mode):
    assert_trains_like_device(mode, "adam", Pool.NONE, "cpu", dims=(8, 8), steps=12)


@pytest.mark.parametrize("mode", ["hybrid", "cache", "cache_prefetch"])
def test_no_eviction_tables_train_like_the_all_device_module(mode):
    # NO_EVICTION grows from 64 rows: expansions of the host tier (and of the
    # hybrid split) while the cache stays its size.
    m, _, _ = assert_trains_like_device(
        mode,
        "adam",
        Pool.SUM,
        "cpu",
        dims=(8, 12),
        max_capacity=64,
        score_strategy=Score.NO_EVICTION,
    )
    backing = m.storage.backing if isinstance(m.storage, CachedStorage) else m.storage
    assert backing.table.row_capacity(0) > 64


@pytest.mark.parametrize("mode", ["hybrid", "host", "cache"])
def test_expanding_tables_train_like_the_all_device_module(mode):
    # 256 initial rows growing toward 4096: every expansion moves the rows.
    m, _, _ = assert_trains_like_device(
        mode, "sgd", Pool.SUM, "cpu", dims=(8, 12), init_capacity=256
    )
    backing = m.storage.backing if isinstance(m.storage, CachedStorage) else m.storage
    assert backing.table.capacity(0) > 256


def test_compound_scores_travel_with_the_keys_between_the_tiers():
    # LFU counts add up across the tiers: the cache's and the host table's
    # scores of every key, merged, are the all-device table's.
    kw = dict(score_strategy=(Score.TIMESTAMP, Score.LFU))
    m, reference, _ = assert_trains_like_device("cache", "sgd", Pool.SUM, "cpu", dims=(8, 12), **kw)
    m.flush()  # every cached key's scores in the host table too
    for t in range(2):
        want = {
            int(k): int(s[1])
            for rows in reference.rows.export_rows(t, 1 << 20)
            for k, s in zip(rows.keys, rows.scores)
        }
        got = {
            int(k): int(s[1])
            for rows in m.storage.backing.export_rows(t, 1 << 20)
            for k, s in zip(rows.keys, rows.scores)
        }
        assert got == want  # the frequency column, in tuple order (TIMESTAMP, LFU)


def test_hybrid_tiers_split_at_the_budget():
    m = module("hybrid", (8, 12), "adam")
    assert isinstance(m.storage, HashTableStorage)
    p = m.storage.placement
    for t in range(2):
        rb = m.layout.row_bytes[t]
        assert p.dev_rows[t] == (4096 * rb // 2) // rb
        assert p.rows[t] - p.dev_rows[t] == 4096 - p.dev_rows[t]
    f = m.storage.footprint()
    rows_bytes = sum(4096 * rb for rb in m.layout.row_bytes)
    assert f.host == rows_bytes - sum(d * rb for d, rb in zip(p.dev_rows, m.layout.row_bytes))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("score", [Score.TIMESTAMP, Score.NO_EVICTION], ids=["timestamp", "rows"])
def test_hybrid_rows_used_again_stay_in_device_memory(device, score):
    # An eighth of the rows in device memory; 40 keys in every batch, the
    # rest of each batch new: the 40 end up in device memory and stop
    # crossing the bus, and the table still trains like the all-device one.
    kw = dict(max_capacity=1024, score_strategy=score)
    opt, args = OPTIMIZERS["adam"]
    options = replace(
        table_options("hybrid", (8,), opt, **kw),
        local_hbm_for_values=1024 * value_row_bytes(opt, 8, torch.float32) // 8,
    )
    m = BatchedDynamicEmbeddingTablesV2(options, optimizer=opt, device=torch.device(device), **args)
    assert 0 < m.storage.placement.dev_rows[0] < m.storage.placement.rows[0]
    reference = module("device", (8,), "adam", device=device, **kw)
    g = torch.Generator().manual_seed(3)
    hot = torch.randperm(100_000, generator=g)[:40]
    data = []
    for step in range(16):
        tail = 100_000 + step * 50 + torch.arange(50)
        indices = torch.cat([hot, tail])[torch.randperm(90, generator=g)]
        data.append((indices, torch.arange(0, 91, 3)))
    got = train(m, data[:12], device=device)
    reads = int(m.storage.host_reads)
    got += train(m, data[12:], device=device, first=12)
    want = train(reference, data, device=device)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    k = hot.to(device)
    assert bool((m.storage.eval_rows(k, torch.zeros_like(k)) < m.storage.placement.size0).all())
    # The last 4 steps read no row twice: only their 50 new keys were on the
    # host, and new rows are made on the device.
    assert int(m.storage.host_reads) == reads
    assert int(m.storage.promotions) >= 40
    ((fg, eg, sg),), ((_, ew, sw),) = (rows_of(x, [set(hot.tolist())]) for x in (m, reference))
    assert bool(fg.all()) and torch.equal(eg, ew) and torch.equal(sg, sw)

"""MultiTableKVCounter against hand-computed sequences and against the
pure-Python model (counter_model.py); dump and load; CUDA against CPU."""

import io
import os

import pytest
import torch

from dynamicemb import KVCounter, MemoryType
from dynamicemb.admission import MultiTableKVCounter
from tests.admission.counter_model import NEVER, CounterModel
from tests.devices import DEVICES

COUNTERS = ("SIZE", "INSERT_FAILURES", "EVICTIONS", "INSERTS")


def _t(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def _add(c, keys, freqs=None, table=0, release_at=None):
    k = _t(keys, c.device)
    f = torch.ones_like(k) if freqs is None else _t(freqs, c.device)
    tids = torch.full_like(k, table)
    if release_at is None:
        return c.add(k, tids, f).tolist()
    return c.add_and_release(k, tids, f, release_at).tolist()


def _get(c, keys, table=0):
    k = _t(keys, c.device)
    return c.get(k, torch.full_like(k, table)).tolist()


def _counter(c, name):
    return c.table.counter(name).tolist()


# ------------------------------------------------------------ hand-computed


@pytest.mark.parametrize("device", DEVICES)
def test_one_bucket_sequence(device):
    c = MultiTableKVCounter([KVCounter(16, bucket_capacity=16)], device)
    # Sixteen keys fill the bucket, in call order: key i at position i - 1.
    assert _add(c, range(1, 17)) == [1] * 16
    assert _add(c, [1], [2]) == [3]
    # Full: a new key evicts the smallest count, the first such slot (key 2).
    assert _add(c, [100]) == [1]
    assert _get(c, [2, 100]) == [0, 1]
    # 100 is found (and so kept) first; 200 then evicts key 3.
    assert _add(c, [100, 200]) == [2, 1]
    assert _get(c, [3, 100, 200]) == [0, 2, 1]
    assert _counter(c, "EVICTIONS") == [2] and _counter(c, "SIZE") == [16]
    # Every slot found in this call: the new key has no room and is not stored.
    stored = [1, 100, 200] + list(range(4, 17))
    assert _add(c, stored + [300]) == [4, 3, 2] + [2] * 13 + [1]
    assert _get(c, [300]) == [0] and _counter(c, "INSERT_FAILURES") == [1]


@pytest.mark.parametrize("device", DEVICES)
def test_keys_reaching_the_threshold_leave_and_free_their_slot(device):
    c = MultiTableKVCounter([KVCounter(16, bucket_capacity=16)], device)
    _add(c, range(1, 17))
    # 1 reaches 3 and leaves; 50 then takes its slot without evicting.
    assert _add(c, [1, 50], [2, 1], release_at=3) == [3, 1]
    assert _get(c, [1, 50]) == [0, 1]
    assert _counter(c, "SIZE") == [16] and _counter(c, "EVICTIONS") == [0]
    # An absent key counted past the threshold at once is never stored.
    assert _add(c, [60], [5], release_at=3) == [5]
    assert _get(c, [60]) == [0] and _counter(c, "EVICTIONS") == [0]
    # A stored key is taken before the new keys of its call: 2 reaches 3 and
    # leaves, and 70, earlier in the call, takes its slot without evicting.
    assert _add(c, [70, 2], [1, 2], release_at=3) == [1, 3]
    assert _get(c, [2, 70]) == [0, 1]
    assert _counter(c, "EVICTIONS") == [0] and _counter(c, "SIZE") == [16]


@pytest.mark.parametrize("device", DEVICES)
def test_a_stored_key_is_found_before_a_new_key_of_its_call_evicts(device):
    c = MultiTableKVCounter([KVCounter(16, bucket_capacity=16)], device)
    _add(c, range(1, 17))  # counts 1; key 1 (position 0) is the bucket's victim
    # 100 comes first, but key 1 is stored: found first and kept; 100 evicts key 2.
    assert _add(c, [100, 1]) == [1, 2]
    assert _get(c, [1, 2, 100]) == [2, 0, 1]
    assert _counter(c, "EVICTIONS") == [1] and _counter(c, "SIZE") == [16]
    # A stored key released by an earlier occurrence comes back as a new key,
    # at its turn among the new keys: 3 leaves, 200 takes its slot, then 3
    # evicts the first smallest count, 100 (position 1).
    assert _add(c, [3, 200, 3], [2, 1, 1], release_at=3) == [3, 1, 1]
    assert _get(c, [3, 4, 100, 200]) == [1, 1, 0, 1]
    assert _counter(c, "EVICTIONS") == [2] and _counter(c, "SIZE") == [16]


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_keys_in_one_call_count_in_order(device):
    c = MultiTableKVCounter([KVCounter(64, bucket_capacity=16)], device)
    assert _add(c, [5, 5, 6, 5], [1, 2, 1, 1]) == [1, 3, 1, 4]
    # 5 reaches 6 and leaves; its next occurrence starts over.
    assert _add(c, [5, 5, 5], [1, 1, 1], release_at=6) == [5, 6, 1]
    assert _get(c, [5, 6]) == [1, 1]


def test_tables_count_the_same_key_apart_and_erase():
    c = MultiTableKVCounter([KVCounter(64, 16), KVCounter(64, 32)])
    k = _t([9, 9, 9])
    assert c.add(k, _t([0, 1, 1]), _t([1, 1, 1])).tolist() == [1, 1, 2]
    c.erase(_t([9, 10]), _t([1, 1]))
    assert c.get(_t([9, 9]), _t([0, 1])).tolist() == [1, 0]
    assert c.size().tolist() == [1, 0]


@pytest.mark.parametrize(
    "args, error, named",
    [
        ((_t([1.0]).float(), _t([0]), _t([1])), TypeError, "float32"),
        ((_t([1, 2]), _t([0]), _t([1, 1])), ValueError, r"\(1,\)"),
        ((_t([1]), _t([0]), _t([-1])), ValueError, "-1"),
        ((_t([1]), _t([3]), _t([1])), ValueError, "table id 3"),
        ((_t([-(2**63)]), _t([0]), _t([1])), ValueError, "reserved"),
    ],
)
def test_bad_input_is_refused_naming_it_and_changes_nothing(args, error, named):
    c = MultiTableKVCounter([KVCounter(64, 16)])
    c.add(_t([4]), _t([0]), _t([2]))
    before = (c.table.keys.clone(), c.table.scores.clone(), c.table.counters.clone())
    with pytest.raises(error, match=named):
        c.add(*args)
    after = (c.table.keys, c.table.scores, c.table.counters)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


# ----------------------------------------------------------- against the model


def _compare(c, model):
    assert c.table.keys.tolist() == model.keys
    assert c.table.scores.tolist() == model.scores
    for name, col in zip(COUNTERS, (0, 1, 2, 5)):
        assert _counter(c, name) == [row[col] for row in model.counters], name


@pytest.mark.parametrize("seed", range(6))
def test_random_calls_match_the_model(seed):
    g = torch.Generator().manual_seed(seed)
    shares = [(48, 16), (64, 32)]
    c = MultiTableKVCounter([KVCounter(cap, bucket_capacity=w) for cap, w in shares])
    model = CounterModel(shares)
    for _ in range(12):
        n = int(torch.randint(1, 120, (1,), generator=g))
        keys = torch.randint(-40, 200, (n,), generator=g)
        tids = torch.randint(0, 2, (n,), generator=g)
        freqs = torch.randint(0, 4, (n,), generator=g)
        release = [NEVER, 2, 3, 5][int(torch.randint(0, 4, (1,), generator=g))]
        got = c.add_and_release(keys, tids, freqs, release).tolist()
        assert got == model.add_and_release(keys.tolist(), tids.tolist(), freqs.tolist(), release)
        _compare(c, model)
        gone = keys[torch.randint(0, n, (n // 4,), generator=g)]
        c.erase(gone, torch.zeros_like(gone))
        model.erase(gone.tolist(), [0] * gone.numel())
        _compare(c, model)


# -------------------------------------------------------------- dump / load


def _filled(device="cpu", key_type=torch.int64):
    c = MultiTableKVCounter(
        [KVCounter(64, 16, key_type=key_type), KVCounter(128, 32, key_type=key_type)], device
    )
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(-1000, 1000, (150,), generator=g)
    tids = torch.randint(0, 2, (150,), generator=g)
    c.add(keys.to(device), tids.to(device), torch.randint(1, 5, (150,), generator=g).to(device))
    return c


def _content(c, table):
    b = c.table.export_batch(*c.table.slot_range(table)).compact()
    return sorted(zip(b.keys.tolist(), b.scores[:, 0].tolist()))


@pytest.mark.parametrize("key_type", [torch.int64, torch.int32])
def test_dump_load_round_trip_through_files(tmp_path, key_type):
    c = _filled(key_type=key_type)
    fresh = MultiTableKVCounter(
        [KVCounter(64, 16, key_type=key_type), KVCounter(128, 32, key_type=key_type)]
    )
    for t in range(2):
        c.dump(tmp_path / f"k{t}", tmp_path / f"c{t}", t)
        size = _content(c, t)
        itemsize = torch.empty(0, dtype=key_type).element_size()
        assert os.path.getsize(tmp_path / f"k{t}") == len(size) * itemsize
        assert os.path.getsize(tmp_path / f"c{t}") == len(size) * 8
        fresh.load(tmp_path / f"k{t}", tmp_path / f"c{t}", t)
        assert _content(fresh, t) == _content(c, t)


def test_dump_load_with_file_objects_and_load_replaces_counts():
    c = _filled()
    kf, cf = io.BytesIO(), io.BytesIO()
    c.dump(kf, cf, 1)
    other = MultiTableKVCounter([KVCounter(64, 16), KVCounter(128, 32)])
    key = _content(c, 1)[0][0]
    other.add(_t([key]), _t([1]), _t([50]))
    kf.seek(0), cf.seek(0)
    other.load(kf, cf, 1)
    assert _content(other, 1) == _content(c, 1)


def _raw(values):
    return torch.tensor(values, dtype=torch.int64).numpy().tobytes()


@pytest.mark.parametrize(
    "keys, counts, table, named",
    [
        (b"\x01" * 12, b"\x00" * 8, 0, "12 bytes"),
        (_raw([1, 2]), _raw([1]), 0, "2 keys"),
        (_raw([-(2**63)]), _raw([1]), 0, "reserved"),
        (_raw([5]), _raw([-3]), 0, "negative"),
        (_raw([5, 5]), _raw([1, 2]), 0, "2 times"),
        (_raw([5]), _raw([1]), 2, "table_id"),
    ],
)
def test_bad_files_are_refused_and_change_nothing(keys, counts, table, named):
    c = _filled()
    before = (c.table.keys.clone(), c.table.scores.clone(), c.table.counters.clone())
    with pytest.raises(ValueError, match=named):
        c.load(io.BytesIO(keys), io.BytesIO(counts), table)
    after = (c.table.keys, c.table.scores, c.table.counters)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_load_into_a_smaller_counter_warns_what_was_left_out():
    c = MultiTableKVCounter([KVCounter(256, 16)])
    keys = torch.arange(1, 200)
    c.add(keys, torch.zeros_like(keys), torch.ones_like(keys))
    kf, cf = io.BytesIO(), io.BytesIO()
    c.dump(kf, cf, 0)
    small = MultiTableKVCounter([KVCounter(32, 16)])
    kf.seek(0), cf.seek(0)
    with pytest.warns(UserWarning, match="were not loaded"):
        small.load(kf, cf, 0)
    assert int(small.size()[0]) == 32


def test_memory_usage_is_the_tables_bytes_on_its_device():
    c = MultiTableKVCounter([KVCounter(100, 32), KVCounter(64, 16)])
    t = c.table
    want = sum(
        x.numel() * x.element_size()
        for x in (t.keys, t.digests, t.scores, t.info, t.counters, t.free_rows)
    )
    assert c.memory_usage(MemoryType.HOST) == want
    assert c.memory_usage() == 0  # DEVICE: none on the CPU
    assert t.num_slots == 128 + 64


# -------------------------------------------------------------- CUDA vs CPU


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_cuda_counter_equals_the_cpu_counter(seed):
    g = torch.Generator().manual_seed(seed)
    shares = [KVCounter(4096, 128), KVCounter(1 << 14, 1024), KVCounter(256, 16)]
    cpu = MultiTableKVCounter(shares, "cpu")
    gpu = MultiTableKVCounter(shares, "cuda")
    for _ in range(20):
        n = int(torch.randint(1, 50000, (1,), generator=g))
        keys = torch.randint(-(10**6), 10**6, (n,), generator=g)
        tids = torch.randint(0, 3, (n,), generator=g)
        freqs = torch.randint(0, 5, (n,), generator=g)
        release = [NEVER, 3, 8][int(torch.randint(0, 3, (1,), generator=g))]
        want = cpu.add_and_release(keys, tids, freqs, release)
        got = gpu.add_and_release(keys.cuda(), tids.cuda(), freqs.cuda(), release)
        assert torch.equal(got.cpu(), want)
        for a, b in ((cpu.table.keys, gpu.table.keys), (cpu.table.scores, gpu.table.scores)):
            assert torch.equal(a, b.cpu())
        assert torch.equal(cpu.table.digests, gpu.table.digests.cpu())
        assert torch.equal(cpu.table.counters, gpu.table.counters.cpu())

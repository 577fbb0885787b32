"""MultiTableKVCounter.admit_missing (the op counter_admit): admission's one
pass is the store's lookup, then add_and_release of the missing keys alone,
in batch order, on a twin counter; bad input changes nothing; CUDA against
CPU."""

import pytest
import torch

from dynamicemb import KVCounter
from dynamicemb.admission import MultiTableKVCounter
from dynamicemb.table import ScoredHashTable, constants, enums, pad_key
from tests.devices import DEVICES

A = enums.Admission
SHARES = [KVCounter(64, 16), KVCounter(256, 32)]


def _store(device, keys_per_table=(40, 90), seed=0):
    """An embedding table of two tables holding some keys of [0, 400)."""
    g = torch.Generator().manual_seed(seed)
    t = ScoredHashTable([256, 512], bucket_capacities=[32, 64], device=device, validate=False)
    for table, n in enumerate(keys_per_table):
        keys = torch.randperm(400, generator=g)[:n]
        t.insert(keys.to(device), torch.full_like(keys, table).to(device))
    return t


def _batch(g, n, pad, device):
    """Distinct (table, key) pairs grouped by table, then ``pad`` padding
    entries (the padded unique's layout)."""
    tables = torch.randint(0, 2, (n,), generator=g)
    pairs = torch.unique(torch.stack([tables, torch.randint(0, 400, (n,), generator=g)]), dim=1)
    tids, keys = pairs[0], pairs[1]
    freqs = torch.randint(1, 4, keys.shape, generator=g)
    keys = torch.cat([keys, torch.full((pad,), pad_key())])
    tids = torch.cat([tids, torch.ones(pad, dtype=torch.int64)])
    freqs = torch.cat([freqs, torch.zeros(pad, dtype=torch.int64)])
    return keys.to(device), tids.to(device), freqs.to(device)


def _same_counter(a, b):
    for x, y in zip(a.state_tensors(), b.state_tensors()):
        assert torch.equal(x.cpu(), y.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("threshold", [0, 1, 3])
def test_one_pass_is_the_lookup_then_the_missing_keys_counted_alone(device, threshold):
    store = _store(device)
    fused = MultiTableKVCounter(SHARES, device)
    twin = MultiTableKVCounter(SHARES, device)
    g = torch.Generator().manual_seed(threshold)
    for step in range(8):
        keys, tids, freqs = _batch(g, 150, pad=step % 3 * 7, device=device)
        status, per_table = fused.admit_missing(keys, tids, freqs, threshold, store)
        valid = keys != pad_key()
        stored = torch.zeros_like(valid)
        stored[valid] = store.find(keys[valid], tids[valid]) >= 0
        missing = (valid & ~stored).nonzero().squeeze(1)
        counts = twin.add_and_release(keys[missing], tids[missing], freqs[missing], threshold)
        want = torch.full(keys.shape, int(A.NONE), dtype=torch.int8, device=device)
        want[stored] = int(A.STORED)
        admitted = counts >= threshold
        want[missing] = torch.where(admitted, int(A.ADMITTED), int(A.REJECTED)).to(torch.int8)
        assert torch.equal(status, want), f"step {step}"
        want_per_table = torch.zeros((2, 2), dtype=torch.int64, device=device)
        want_per_table[:, 0].index_add_(0, tids[missing], admitted.long())
        want_per_table[:, 1].index_add_(0, tids[missing], (~admitted).long())
        assert torch.equal(per_table, want_per_table)
        _same_counter(fused, twin)
    # The store was only read.
    assert torch.equal(store.size().cpu(), torch.tensor([40, 90]))


def test_an_empty_batch_decides_nothing():
    store, c = _store("cpu"), MultiTableKVCounter(SHARES)
    empty = torch.empty(0, dtype=torch.int64)
    status, per_table = c.admit_missing(empty, empty, empty, 2, store)
    assert status.numel() == 0 and per_table.tolist() == [[0, 0], [0, 0]]


@pytest.mark.parametrize(
    "change, named",
    [
        ("reserved", "is reserved"),
        ("table", "out of range"),
        ("frequency", "frequency"),
        ("threshold", "threshold"),
        ("store", "the store has 1 tables but the counter 2"),
    ],
)
def test_bad_input_is_refused_naming_it_and_changes_nothing(change, named):
    store, c = _store("cpu"), MultiTableKVCounter(SHARES)
    c.add(torch.arange(50), torch.zeros(50, dtype=torch.int64), torch.ones(50, dtype=torch.int64))
    keys, tids, freqs = _batch(torch.Generator().manual_seed(1), 60, pad=3, device="cpu")
    threshold = 2
    if change == "reserved":
        keys[5] = int(constants()["LOCKED_KEY"])
    elif change == "table":
        tids[4] = 2
    elif change == "frequency":
        freqs[3] = -1
    elif change == "threshold":
        threshold = -1
    elif change == "store":
        store = ScoredHashTable([256], bucket_capacities=[32], validate=False)
    before = [x.clone() for x in c.state_tensors()]
    with pytest.raises(ValueError, match=named):
        c.admit_missing(keys, tids, freqs, threshold, store)
    assert all(torch.equal(a, b) for a, b in zip(before, c.state_tensors()))


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_cuda_admission_equals_the_cpu_admission(seed):
    """Batches of up to 50,000 pairs over counters that fill and evict, and
    stores of a few thousand keys."""
    g = torch.Generator().manual_seed(seed)
    shares = [KVCounter(4096, 128), KVCounter(1 << 14, 1024)]
    stores = {}
    for dev in ("cpu", "cuda"):
        t = ScoredHashTable([8192, 8192], bucket_capacities=[128, 128], device=dev, validate=False)
        keys = torch.arange(0, 200000, 50)
        for table in range(2):
            t.insert(keys.to(dev), torch.full_like(keys, table).to(dev))
        stores[dev] = t
    cpu, gpu = MultiTableKVCounter(shares, "cpu"), MultiTableKVCounter(shares, "cuda")
    for _ in range(10):
        n = int(torch.randint(1, 50000, (1,), generator=g))
        keys = torch.randint(0, 200000, (n,), generator=g)
        tids = torch.randint(0, 2, (n,), generator=g)
        pairs = torch.unique(torch.stack([tids, keys]), dim=1)
        pad = int(torch.randint(0, 100, (1,), generator=g))
        keys = torch.cat([pairs[1], torch.full((pad,), pad_key())])
        tids = torch.cat([pairs[0], torch.ones(pad, dtype=torch.int64)])
        freqs = torch.randint(0, 4, keys.shape, generator=g)
        threshold = int(torch.randint(0, 5, (1,), generator=g))
        want = cpu.admit_missing(keys, tids, freqs, threshold, stores["cpu"])
        got = gpu.admit_missing(keys.cuda(), tids.cuda(), freqs.cuda(), threshold, stores["cuda"])
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b)
        _same_counter(cpu, gpu)


@pytest.mark.gpu
def test_cuda_admission_takes_invalid_entries_as_none():
    """On the GPU nothing is checked (that would synchronize): a reserved key
    or a table id out of range is NONE and touches nothing."""
    store, c = _store("cuda"), MultiTableKVCounter(SHARES, "cuda")
    keys = torch.tensor([int(constants()["LOCKED_KEY"]), 7, 9], device="cuda")
    tids = torch.tensor([0, 5, 0], device="cuda")
    status, per_table = c.admit_missing(keys, tids, torch.ones_like(keys), 5, store)
    in_store = bool(store.find(keys[2:], tids[2:])[0] >= 0)
    assert status[:2].tolist() == [int(A.NONE)] * 2
    assert status[2].item() == int(A.STORED if in_store else A.REJECTED)
    assert int(c.size().sum()) == (0 if in_store else 1)


@pytest.mark.parametrize("device", DEVICES)
def test_counter_ops_opcheck(device):
    """counter_add and counter_admit: their schemas (the counter's tensors
    written in place), fake kernels against the real ones, and tracing."""
    from dynamicemb.table import ops

    store = _store(device)
    counter = MultiTableKVCounter(SHARES, device)
    keys, tids, freqs = _batch(torch.Generator().manual_seed(5), 40, pad=3, device=device)
    counter.add(keys[:10], tids[:10], freqs[:10])
    buckets = counter.table.total_buckets

    def state():
        return tuple(x.clone() for x in counter.state_tensors())

    store_state = (store.keys, store.digests, store.scores, store.info)
    valid = keys != pad_key()
    torch.library.opcheck(
        ops().counter_add.default,
        (keys[valid], tids[valid], *state(), freqs[valid], 3, buckets),
    )
    torch.library.opcheck(
        ops().counter_admit.default,
        (keys, tids, *store_state, *state(), freqs, 2, buckets),
    )

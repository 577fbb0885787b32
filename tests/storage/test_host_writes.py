"""Rows on their way to host memory off the step's stream (``HostWrites``):
a cache's victims and a hybrid table's staged rows are gathered into device
memory and written to their host rows later (on a side stream on a GPU, at
the next ``wait`` on the CPU, as late as a GPU may), and every mode trains
bit for bit as when each row is written at once; a prefetch leaves its
batch nothing to evict."""

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as Score
from dynamicemb.storage import space as sp
from dynamicemb.storage.host_writes import AT_ONCE, INITIAL_ROWS, HostWrites
from dynamicemb.storage.layout import RowLayout
from dynamicemb.types import MemoryType
from tests.devices import DEVICES
from tests.storage import storage_cases as sc


def _writes(m) -> HostWrites:
    s = m.storage
    return s.backing.writes if hasattr(s, "backing") else s.writes


def _trained(mode, max_rows, device, prefetch=False, **kw):
    m = sc.module(mode, optimizer="adam", device=device, **kw)
    _writes(m).max_rows = max_rows
    dims = len(m.dims)
    data = sc.batches(14, dims, batch=48, vocab=600)
    data = [(i.to(device), o.to(device)) for i, o in data]
    outs = sc.train(m, data, prefetch=prefetch, device=device)
    return m, outs, sc.rows_of(m, sc.seen_keys(data, list(range(dims))))


def _assert_same(a, b) -> None:
    (_, outs_a, rows_a), (_, outs_b, rows_b) = a, b
    for step, (x, y) in enumerate(zip(outs_a, outs_b)):
        assert torch.equal(x, y), step
    for t, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        for x, y in zip(ra, rb):
            assert torch.equal(x, y), t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_rows", [None, 3], ids=["staged", "some_staged"])
@pytest.mark.parametrize(
    "mode,prefetch", [("cache", False), ("cache", True), ("cache_small", False), ("hybrid", False)]
)
def test_staged_host_writes_train_like_rows_written_at_once(mode, prefetch, max_rows, device):
    # max_rows 0 (the default): every row written through the mapped
    # pointer at once; None: every row staged; 3: the first three of each
    # call (in address order) staged, the others written at once.
    direct = _trained(mode, 0, device, prefetch)
    staged = _trained(mode, max_rows, device, prefetch)
    _assert_same(staged, direct)
    m = staged[0]
    assert int(m.storage.host_writes) > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy", [Score.STEP, Score.LFU])
def test_a_staged_victim_whose_host_slot_a_later_key_took_is_not_written(strategy, device):
    # A host table of one bucket of 128 rows, full and evicting, under a
    # cache of 16: a step's victims go back into it, then the keys the cache
    # cannot take are inserted into it and may evict a victim just written;
    # that victim's staged row must not land on the new key's row after.
    kw = dict(dims=(8,), max_capacity=128, score_strategy=strategy)
    direct = _trained("cache_small", 0, device, **kw)
    staged = _trained("cache_small", None, device, **kw)
    assert int(staged[0].storage.overflows) > 0
    _assert_same(staged, direct)


@pytest.mark.parametrize("device", DEVICES)
def test_after_a_prefetch_its_batch_evicts_nothing(device):
    m = sc.module("cache", optimizer="sgd", device=device)
    data = [(i.to(device), o.to(device)) for i, o in sc.batches(12, 2)]
    sc.train(m, data[:10], device=device)
    cache, backing = m.storage.cache, m.storage.backing
    assert int(cache.table.size().sum()) == cache.table.num_slots  # full: inserts evict
    out = m(*data[10])
    keys, tids = _distinct(m, *data[11])
    new = ~cache.contains(keys, tids) & ~backing.contains(keys, tids)
    assert int(new.sum()) > 0
    m.prefetch(*data[11])
    # The new keys are stored nowhere yet (the prefetch left their slots
    # free, not filled) ...
    assert not bool(cache.contains(keys[new], tids[new]).any())
    assert not bool(backing.contains(keys[new], tids[new]).any())
    out.sum().backward()
    writes, reads = int(m.storage.host_writes), int(m.storage.host_reads)
    m(*data[11]).sum().backward()
    # ... and their batch finds every other key in the cache and evicts
    # nothing: no row crossed the bus.
    assert (int(m.storage.host_writes), int(m.storage.host_reads)) == (writes, reads)
    assert bool(cache.contains(keys, tids).all())


def _distinct(m, indices, offsets):
    from dynamicemb.embedding.unique import segmented_unique

    su = segmented_unique(indices, m._occurrence_tables(indices, offsets), len(m.table_options))
    return su.keys, su.table_ids


def _layout() -> RowLayout:
    return RowLayout([4, 2], torch.float32, None, False)  # rows of 16 bytes at most


def _rows(n: int, rb: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n * rb,), dtype=torch.uint8, generator=g)


def test_staged_rows_are_written_at_the_next_wait_on_the_cpu():
    layout = _layout()
    rb = layout.max_row_bytes
    w = HostWrites(layout, torch.device("cpu"))
    src, dst = _rows(6, rb, 0), _rows(8, rb, 1)
    before = dst.clone()
    space, empty = (dst, dst.new_empty(0)), src.new_empty(0)
    src_off = torch.tensor([0, 1, 2, -1, 4, 5]) * rb
    dst_off = torch.tensor([7, 0, -1, 3, 5, 2]) * rb
    nbytes = torch.full((6,), rb)
    # In address order (destination rows 0, 2, 5, 7; the two entries without
    # a row after them): the first two staged, the others written at once.
    w.max_rows = 2
    w.stage(space, dst_off.clamp(min=-1), (src, empty), src_off.clamp(min=-1), nbytes)
    want = before.clone().view(8, rb)
    s = src.view(6, rb)
    for i, j in ((4, 5), (0, 7)):
        want[j] = s[i]
    assert torch.equal(dst.view(8, rb), want)
    src.zero_()  # the staged rows were copied out: their source is free
    w.wait()
    for i, j in ((1, 0), (5, 2)):
        want[j] = _rows(6, rb, 0).view(6, rb)[i]
    assert torch.equal(dst.view(8, rb), want)
    w.wait()  # nothing left
    assert torch.equal(dst.view(8, rb), want)


def test_queued_rows_and_dropped_rows():
    layout = _layout()
    rb = layout.max_row_bytes
    w = HostWrites(layout, torch.device("cpu"))
    w.max_rows = None  # every row staged
    buf, dst = _rows(3, rb, 2).view(3, rb), _rows(4, rb, 3)
    before = dst.clone().view(4, rb)
    space = (dst, dst.new_empty(0))
    w.queue(space, torch.tensor([2, -1, 0]) * rb, buf, torch.full((3,), rb))
    # A staged write of two rows whose slots then hold other keys for one.
    src = _rows(2, rb, 4)
    keys, slots = torch.tensor([10, 11]), torch.tensor([1, 3])
    w.stage(
        space,
        slots * rb,
        (src, src.new_empty(0)),
        torch.tensor([0, 1]) * rb,
        torch.full((2,), rb),
        keys=keys,
        slots=slots,
    )
    keys_at = torch.tensor([-5, 10, -5, 99])  # slot 3 holds key 99 now
    w.drop_moved(keys_at)
    w.wait()
    want = before.clone()
    want[2], want[0], want[1] = buf[0], buf[2], src.view(2, rb)[0]
    assert torch.equal(dst.view(4, rb), want)


def _shuffled_case(n: int, seed: int):
    """n source rows to n distinct destination rows of a host segment of
    2n, in random order, some entries without a row on either side."""
    layout = _layout()
    rb = layout.max_row_bytes
    g = torch.Generator().manual_seed(seed)
    src, dst = _rows(n, rb, seed), _rows(2 * n, rb, seed + 1)
    src_rows = torch.randperm(n, generator=g)
    dst_rows = torch.randperm(2 * n, generator=g)[:n]
    src_rows[::7], dst_rows[3::11] = -1, -1
    want = dst.clone().view(2 * n, rb)
    for i, j in zip(src_rows.tolist(), dst_rows.tolist()):
        if i >= 0 and j >= 0:
            want[j] = src.view(n, rb)[i]
    return layout, src, dst, src_rows * rb, dst_rows * rb, want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("by", [None, "dst", "src"])
def test_copy_rows_in_address_order_lands_each_row_at_its_place(by, device):
    layout, src, dst, src_off, dst_off, want = _shuffled_case(200, 5)
    src, dst, src_off, dst_off = (t.to(device) for t in (src, dst, src_off, dst_off))
    rb = layout.max_row_bytes
    nbytes = torch.full((200,), rb, device=device)
    sp.copy_rows((dst, dst.new_empty(0)), dst_off, (src, src.new_empty(0)), src_off, nbytes, by=by)
    assert torch.equal(dst.view(-1, rb).cpu(), want)


def test_address_order_sorts_the_valid_entries_and_leaves_the_others_last():
    offsets = torch.tensor([48, -1, 16, 32, 16, 0, 64])
    valid = torch.tensor([True, False, True, True, True, False, True])
    order = sp.address_order(offsets, valid)
    # 16 twice in their order (entries 2 then 4); the invalid 1 and 5 last.
    assert order.tolist() == [2, 4, 3, 0, 6, 1, 5]
    with pytest.raises(ValueError, match="'host'"):
        sp.copy_rows((offsets,), offsets, (offsets,), offsets, offsets, by="host")


@pytest.mark.parametrize("max_rows", [None, 0, 37])
def test_shuffled_write_back_rows_land_at_their_host_rows(max_rows):
    # Rows given in random order, staged (all, none or some): each lands on
    # its own host row, whatever order the copies take.
    n = 200
    layout, src, dst, src_off, dst_off, want = _shuffled_case(n, 6)
    rb = layout.max_row_bytes
    w = HostWrites(layout, torch.device("cpu"))
    w.max_rows = max_rows
    keys = torch.arange(n) + 1000
    slots = (dst_off // rb).clamp(min=-1)
    space = (dst, dst.new_empty(0))
    nbytes = torch.full((n,), rb)
    w.stage(space, dst_off, (src, src.new_empty(0)), src_off, nbytes, keys=keys, slots=slots)
    src.zero_()  # the staged rows were copied out
    # Every slot still holds its key except the lowest one written (the
    # first in address order: staged whenever any is), whose row must not land.
    keys_at = torch.full((2 * n,), -5)
    keys_at[slots[slots >= 0]] = keys[slots >= 0]
    moved = (slots >= 0) & (src_off >= 0)
    gone = int(torch.where(moved, slots, 2 * n).argmin())
    keys_at[slots[gone]] = 7
    w.drop_moved(keys_at)
    w.wait()
    got = dst.view(2 * n, rb)
    staged = w.capacity(n) > 0
    if staged:  # the dropped row kept what the host row held
        want[slots[gone]] = _rows(2 * n, rb, 7).view(2 * n, rb)[slots[gone]]
    assert torch.equal(got, want)


def test_rows_staged_per_call():
    w = HostWrites(_layout(), torch.device("cpu"))
    assert w.max_rows == AT_ONCE and w.capacity(5000) == 0  # by default none staged
    w.max_rows = None
    assert w.capacity(5000) == 5000  # the CPU stages every row
    w.max_rows = 7
    assert w.capacity(5000) == 7 and w.capacity(3) == 3


def _cuda_case(n: int):
    """A queue on the GPU, a host segment of n rows, n device rows of
    bytes 0, 1, 2, ... and the offsets and sizes of n rows."""
    layout = _layout()
    rb = layout.max_row_bytes
    dev = torch.device("cuda")
    dst = sp.allocate(n * rb, MemoryType.HOST, dev)
    dst.host_view.zero_()
    src = torch.arange(1, n * rb + 1, device=dev).to(torch.uint8)
    rows = (torch.arange(n, device=dev) * rb, torch.full((n,), rb, device=dev))
    w = HostWrites(layout, dev)
    w.max_rows = None  # staged
    return w, dst, (src, src.new_empty(0)), rows


@pytest.mark.gpu
def test_cuda_rows_staged_per_call_grow_with_what_calls_needed():
    n = 5000
    w, dst, src, (off, nbytes) = _cuda_case(n)
    assert w.capacity(10**6) == INITIAL_ROWS
    count = torch.tensor([n], device=src[0].device)
    space = (dst.data, dst.data.new_empty(0))
    w.stage(space, off, src, off, nbytes, count=count)  # INITIAL_ROWS staged
    w.submit()
    torch.cuda.synchronize()
    w.wait()  # the count read back on the host, never waited for
    torch.cuda.synchronize()
    assert torch.equal(dst.host_view, src[0].cpu())
    assert w.rows >= n * 5 // 4 and w.capacity(10**6) == w.rows


def _captured(stage):
    """A CUDA graph of ``stage()`` (nothing runs yet)."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        stage()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


@pytest.mark.gpu
def test_cuda_writes_staged_in_a_capture_run_only_after_its_replays():
    w, dst, src, (off, nbytes) = _cuda_case(4)

    def stage():
        w.stage((dst.data, dst.data.new_empty(0)), off, src, off, nbytes)

    _captured(stage)
    # Not taken (a capture that failed): nothing is written.
    w.wait()
    torch.cuda.synchronize()
    assert int(dst.host_view.sum()) == 0
    graph = _captured(stage)
    taken = w.take()
    graph.replay()
    w.put(taken)
    w.wait()
    torch.cuda.synchronize()
    assert torch.equal(dst.host_view, src[0].cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("max_rows", [None, 3], ids=["staged", "some_staged"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["lookup", "prefetch"])
def test_cuda_graphs_of_staged_lookups_train_like_eager_rows_written_at_once(prefetch, max_rows):
    # Lookups (and prefetches) replayed from CUDA graphs hand the rows they
    # staged to each replay, which writes them on the side stream.
    data = [(i.cuda(), o.cuda()) for i, o in sc.fixed_batches(12)]
    graphed = sc.module("cache_small", optimizer="adam", device="cuda")
    eager = sc.module("cache_small", optimizer="adam", device="cuda")
    eager.cuda_graphs = False
    _writes(graphed).max_rows, _writes(eager).max_rows = max_rows, 0
    got = sc.train(graphed, data, prefetch=prefetch, device="cuda")
    want = sc.train(eager, data, prefetch=prefetch, device="cuda")
    assert graphed._graphs.replays >= len(data) - 2
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), step
    seen = sc.seen_keys(data, [0, 1])
    for (fg, eg, sg), (fw, ew, sw) in zip(sc.rows_of(graphed, seen), sc.rows_of(eager, seen)):
        assert bool(fg.all()) and torch.equal(fg, fw)
        assert torch.equal(eg, ew) and torch.equal(sg, sw)

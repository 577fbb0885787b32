"""The storage tiers on a GPU against the CPU backend, the reference: the
same rows copied, the same decisions (which keys a cache holds, which rows a
hybrid table moves into device memory, what crossed the bus), the rows within
the kernels' float tolerance; the host reads a step makes: one for a split
hybrid table's training lookup, none for a cache's or a prefetch; and a
cache's training lookups replayed from CUDA graphs, as they run eagerly."""

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as Score
from dynamicemb.storage import space as sp
from dynamicemb.types import MemoryType
from tests.embedding.sync_guard import cuda_syncs
from tests.storage.storage_cases import (
    MODES,
    batches,
    fixed_batches,
    module,
    rows_of,
    seen_keys,
    train,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("host", [False, True], ids=["device", "mapped_host"])
def test_cuda_copy_rows_is_the_cpu_copy(host):
    # Rows of 4-byte multiples (the 4-byte path) and of 16-byte multiples at
    # 16-byte addresses (the 16-byte path), one of 3 KiB (past one batch of
    # loads in flight), from two segments into two, some entries skipped.
    g = torch.Generator().manual_seed(0)
    # Offsets from 9600 (the source segments' size) and 10000 (the
    # destination's) are in the second segment.
    nbytes = torch.tensor([48, 20, 512, 3072, 36, 1536, 16, 4], dtype=torch.int64)
    src_off = torch.tensor([0, 52, 96, 10624, 13700, 14608, -1, 17600], dtype=torch.int64)
    dst_off = torch.tensor([4096, 0, 1024, 6000, 20, 12048, 64, -1], dtype=torch.int64)
    src = [torch.randint(0, 256, (9600,), dtype=torch.uint8, generator=g) for _ in range(2)]
    dst = [torch.randint(0, 256, (10000,), dtype=torch.uint8, generator=g) for _ in range(2)]
    want = [d.clone() for d in dst]
    sp.copy_rows(tuple(want), dst_off, tuple(src), src_off, nbytes)
    if host:
        cuda_src = []
        for s in src:
            seg = sp.allocate(s.numel(), MemoryType.HOST, torch.device("cuda"))
            seg.host_view.copy_(s)
            cuda_src.append(seg.data)
    else:
        cuda_src = [s.cuda() for s in src]
    got = [d.cuda() for d in dst]
    sp.copy_rows(tuple(got), dst_off.cuda(), tuple(cuda_src), src_off.cuda(), nbytes.cuda())
    for g_, w in zip(got, want):
        assert torch.equal(g_.cpu(), w)


def _storage_state(m) -> dict:
    """What a storage decided, as integers: the keys each tier holds (and
    where), what crossed the bus, the hybrid table's row map."""
    s = m.storage
    out = {}
    for name in ("overflows", "prefetched", "host_reads", "host_writes", "promotions"):
        if hasattr(s, name):
            out[name] = int(getattr(s, name))
    for tier in ("cache", "backing"):
        t = getattr(s, tier, None)
        if t is not None and hasattr(t, "table"):
            ex = t.table.export_batch().compact()
            out[tier] = sorted(zip(ex.table_ids.tolist(), ex.keys.tolist(), ex.slots.tolist()))
    if not hasattr(s, "cache"):
        ex = s.table.export_batch().compact()
        out["table"] = sorted(zip(ex.table_ids.tolist(), ex.keys.tolist(), ex.slots.tolist()))
        remap = s.placement.remap
        if remap is not None:
            out["remap"] = [x.tolist() for x in remap.tensors()]
    return out


def test_mapped_host_memory_freed_inside_a_capture_keeps_the_capture():
    # A host segment whose last reference goes inside a CUDA graph capture (a
    # module garbage-collected there): its free waits until after the
    # capture instead of synchronizing the device inside it.
    seg = sp.allocate(1 << 20, MemoryType.HOST, torch.device("cuda"))
    x = torch.zeros(4, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        x += 1
        del seg
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    graph.replay()
    assert x.tolist() == [2.0] * 4
    # The deferred free runs with the next one outside a capture.
    sp.allocate(1 << 20, MemoryType.HOST, torch.device("cuda"))
    torch.cuda.synchronize()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("mode", ["hybrid", "host", "cache", "cache_prefetch", "cache_small"])
def test_cuda_storage_decides_what_the_cpu_storage_decides(mode, optimizer):
    # STEP scores: the same on both backends (a TIMESTAMP is each one's clock).
    data = batches(20, 2)
    prefetch = MODES[mode].get("prefetch", False)
    cpu = module(mode, (8, 12), optimizer, score_strategy=Score.STEP)
    gpu = module(mode, (8, 12), optimizer, device="cuda", score_strategy=Score.STEP)
    want = train(cpu, data, prefetch=prefetch)
    got = train(gpu, data, prefetch=prefetch, device="cuda")
    assert _storage_state(gpu) == _storage_state(cpu)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    seen = seen_keys(data, [0, 1])
    for (fg, eg, sg), (fw, ew, sw) in zip(rows_of(gpu, seen), rows_of(cpu, seen)):
        assert torch.equal(fg, fw)
        torch.testing.assert_close(eg, ew, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sg, sw, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "mode,reads",
    [
        # The number of rows to stage (the padded unique reads nothing).
        ("hybrid", 1),
        # Every row in host memory: the kernels address them in place.
        ("host", 0),
        # A cache over a host table at its capacity: the keys it cannot take
        # go to that table, whose rows the kernels address in place.
        ("cache", 0),
        ("cache_small", 0),
    ],
)
def test_cuda_training_step_reads_the_device_once_for_its_storage(mode, reads):
    m = module(mode, (8, 12), "adam", device="cuda")
    m.check_values = False
    m.cuda_graphs = False  # the storage's own reads (a capture synchronizes)
    data = [(i.cuda(), o.cuda()) for i, o in batches(6, 2)]
    train(m, data[:4], device="cuda")

    def step():
        m(*data[4]).sum().backward()

    assert cuda_syncs(step) == reads


def test_cuda_prefetch_never_synchronizes():
    m = module("cache", (8, 12), "adam", device="cuda")
    m.check_values = False
    data = [(i.cuda(), o.cuda()) for i, o in batches(8, 2)]
    train(m, data[:6], device="cuda")
    out = m(*data[6])
    before = int(m.storage.prefetched)
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            m.prefetch(*data[7], forward_stream=main)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert int(m.storage.prefetched) > before
    m(*data[7]).sum().backward()  # waits for the prefetch; trains as without it


@pytest.mark.parametrize("prefetch", [False, True], ids=["lookup", "prefetch"])
@pytest.mark.parametrize("mode", ["cache", "cache_small"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_cuda_cache_lookups_replayed_from_graphs_train_as_eager_ones(mode, optimizer, prefetch):
    # A cache over a host table (its overflow too: cache_small) replays its
    # training lookup from a CUDA graph; with prefetch between the forward and
    # the backward (TorchRec's prefetch pipeline) as well. Everything equals
    # the eager lookups: outputs, rows, what the tiers hold and the counters.
    data = [(i.cuda(), o.cuda()) for i, o in fixed_batches(12)]
    graphed = module(mode, (8, 12), optimizer, device="cuda")
    eager = module(mode, (8, 12), optimizer, device="cuda")
    eager.cuda_graphs = False
    got = train(graphed, data, prefetch=prefetch, device="cuda")
    want = train(eager, data, prefetch=prefetch, device="cuda")
    assert graphed._graphs.replays >= len(data) - 2 and eager._graphs.replays == 0
    if prefetch:  # the prefetches too, over the replayed lookups' tensors
        assert graphed._prefetch_graphs.replays >= len(data) - 4
        assert eager._prefetch_graphs.replays == 0
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), step
    assert _storage_state(graphed) == _storage_state(eager)
    assert torch.equal(graphed.stats.counts, eager.stats.counts)
    seen = seen_keys(data, [0, 1])
    for (fg, eg, sg), (fw, ew, sw) in zip(rows_of(graphed, seen), rows_of(eager, seen)):
        assert bool(fg.all()) and torch.equal(fg, fw)
        assert torch.equal(eg, ew) and torch.equal(sg, sw)
    if mode == "cache_small":
        assert int(graphed.storage.overflows) > 0


def test_cuda_cache_step_replayed_from_a_graph_never_synchronizes():
    m = module("cache", (8, 12), "adam", device="cuda")
    m.check_values = False
    data = [(i.cuda(), o.cuda()) for i, o in fixed_batches(8)]
    # The shape seen, captured, replayed; the prefetches too.
    train(m, data[:5], prefetch=True, device="cuda")
    assert m._graphs.replays > 0 and m._prefetch_graphs.replays > 0

    def step():
        for i in (5, 6):
            out = m(*data[i])
            m.prefetch(*data[i + 1])
            out.sum().backward()

    replays = (m._graphs.replays, m._prefetch_graphs.replays)
    assert cuda_syncs(step) == 0
    assert (m._graphs.replays, m._prefetch_graphs.replays) == (replays[0] + 2, replays[1] + 2)

"""The training lookup replayed from CUDA graphs (dynamicemb/embedding/cuda_graphs.py)
trains exactly as the eager lookup: the same outputs, rows and counters, step
after step, through a restore that rebuilds the tables' tensors and with two
forward passes before their backward; and it never synchronizes. On the CPU:
when a storage's training step may be captured at all."""

import dataclasses

import pytest
import torch

from dynamicemb import (
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb.embedding.cuda_graphs import MAX_GRAPHS
from tests.embedding.tbe_batches import FEATURE_TABLES, train_step, unchecked_module

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType

S = DynamicEmbScoreStrategy
BATCH, HOTNESS, VOCAB = 96, 2, 5000


def _options(strategy=S.TIMESTAMP, max_capacity=4096, **kw):
    return [
        DynamicEmbTableOptions(
            dim=16,
            max_capacity=max_capacity,
            bucket_capacity=128,
            score_strategy=strategy,
            local_hbm_for_values=1 << 24,
            **kw,
        )
        for _ in range(2)
    ]


def _module(device, optimizer="sgd", pooling="SUM", strategy=S.TIMESTAMP, graphs=True):
    opt = EmbOptimType.ADAM if optimizer == "adam" else EmbOptimType.EXACT_SGD
    m = unchecked_module(_options(strategy), opt, pooling, device, 0.05)
    m.cuda_graphs = graphs
    return m


def _batch(step, device, batch=BATCH):
    """A batch of one shape at every step (HOTNESS ids per bag), new ids."""
    g = torch.Generator().manual_seed(step)
    bags = len(FEATURE_TABLES) * batch
    keys = torch.randint(0, VOCAB, (bags * HOTNESS,), generator=g)
    offsets = torch.arange(0, bags * HOTNESS + 1, HOTNESS)
    weights = torch.rand(keys.numel(), generator=g)
    return keys.to(device), offsets.to(device), weights.to(device)


def _rows_by_key(module):
    """Per table: the stored keys, sorted, and their rows (embedding and
    optimizer state)."""
    out = []
    for t in range(len(module.table_options)):
        chunks = list(module.rows.export_rows(t, 1 << 20))
        keys = torch.cat([c.keys for c in chunks])
        emb = torch.cat([c.embeddings for c in chunks])
        order = keys.argsort()
        out.append((keys[order].cpu(), emb[order].float().cpu()))
    return out


def _assert_same_tables(got, want):
    torch.testing.assert_close(got.insert_failures.cpu(), want.insert_failures.cpu())
    torch.testing.assert_close(got.stats.counts.cpu(), want.stats.counts.cpu())
    torch.testing.assert_close(got.rows.counters().cpu(), want.rows.counters().cpu())
    for (gk, ge), (wk, we) in zip(_rows_by_key(got), _rows_by_key(want)):
        assert torch.equal(gk, wk)
        torch.testing.assert_close(ge, we, rtol=1e-6, atol=1e-7)


CASES = [
    ("sgd", "SUM", S.TIMESTAMP, None),
    ("adam", "SUM", S.STEP, "pooling_weights"),
    ("adam", "NONE", S.LFU, "frequency_counters"),
    ("sgd", "MEAN", S.CUSTOMIZED, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer,pooling,strategy,extra", CASES)
def test_replayed_lookups_train_as_the_eager_lookup(optimizer, pooling, strategy, extra):
    graphed = _module("cuda", optimizer, pooling, strategy)
    eager = _module("cuda", optimizer, pooling, strategy, graphs=False)
    if strategy == S.CUSTOMIZED:
        for m in (graphed, eager):
            m.set_score(7)
    for step in range(6):
        batch = _batch(step, "cuda")
        got, want = train_step(graphed, batch, extra), train_step(eager, batch, extra)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=f"step {step}")
    # The first step of the shape runs eagerly, the second is captured and
    # replayed, and so is every one after it.
    assert graphed._graphs.captures == 1
    assert graphed._graphs.replays == 5
    assert eager._graphs.replays == 0
    _assert_same_tables(graphed, eager)


@pytest.mark.gpu
def test_a_restore_rebuilds_the_tensors_and_the_graph_is_captured_again():
    graphed, eager = _module("cuda"), _module("cuda", graphs=False)
    snaps = {}
    for step in range(8):
        if step == 4:  # back to the state after step 1: new table tensors
            for m in (graphed, eager):
                m.rows.restore(snaps[id(m)])
        batch = _batch(step, "cuda")
        torch.testing.assert_close(
            train_step(graphed, batch), train_step(eager, batch), msg=f"{step}"
        )
        if step == 1:
            snaps = {id(m): m.rows.snapshot() for m in (graphed, eager)}
    assert graphed._graphs.captures == 2
    _assert_same_tables(graphed, eager)


@pytest.mark.gpu
def test_two_forwards_before_their_backwards_get_their_own_tensors():
    graphed, eager = _module("cuda"), _module("cuda", graphs=False)
    for step in range(3):
        b = _batch(step, "cuda")
        torch.testing.assert_close(train_step(graphed, b), train_step(eager, b))
    replays = graphed._graphs.replays
    b1, b2 = _batch(10, "cuda"), _batch(11, "cuda")
    outs = {}
    for m in (graphed, eager):
        o1 = m(b1[0], b1[1])
        o2 = m(b2[0], b2[1])  # the first batch still waits for its backward
        ((o1 * o1).sum() + (o2 * o2).sum()).backward()
        outs[id(m)] = (o1.detach(), o2.detach())
    for got, want in zip(outs[id(graphed)], outs[id(eager)]):
        torch.testing.assert_close(got, want)
    assert graphed._graphs.replays == replays + 1  # the second ran eagerly
    _assert_same_tables(graphed, eager)


@pytest.mark.gpu
def test_shapes_past_the_limit_drop_the_oldest_graph():
    graphed, eager = _module("cuda"), _module("cuda", graphs=False)
    sizes = [BATCH + 8 * i for i in range(MAX_GRAPHS + 1)]
    for step in range(2 * len(sizes)):
        b = _batch(step, "cuda", batch=sizes[step % len(sizes)])
        torch.testing.assert_close(train_step(graphed, b), train_step(eager, b))
    assert graphed._graphs.captures == len(sizes)
    assert len(graphed._graphs.graphs) == MAX_GRAPHS
    _assert_same_tables(graphed, eager)


@pytest.mark.gpu
def test_capture_and_replays_never_synchronize():
    module = _module("cuda", "adam", "SUM")
    for step in range(5):
        batch = _batch(step, "cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            train_step(module, batch, "pooling_weights")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert module._graphs.captures == 1 and module._graphs.replays == 4


# ---------------------------------------------------- what may be captured --


def _storage_state(**kw):
    return unchecked_module(_options(**kw), EmbOptimType.EXACT_SGD, "SUM", "cpu", 0.1)


def test_graph_state_names_a_storage_whose_step_never_synchronizes():
    m = _storage_state()
    state = m._graph_state()
    assert state is not None and state == m._graph_state()
    m.eval()
    assert m._graph_state() is None  # eval lookups read the misses


@pytest.mark.parametrize(
    "kw",
    [
        {"init_capacity": 1024},  # can still grow: the step reads its load
        {"strategy": S.NO_EVICTION},  # grows and reads its failures
        {"safe_check_mode": DynamicEmbCheckMode.WARNING},  # reads the failure count
    ],
)
def test_graph_state_is_none_for_steps_that_synchronize(kw):
    assert _storage_state(**kw)._graph_state() is None


@pytest.mark.parametrize(
    "budget, captured",
    [
        (1 << 24, True),  # every row in device memory
        (0, True),  # every row in host memory, addressed in place
        (1 << 17, False),  # half of each table's rows: its host rows are staged
    ],
)
def test_graph_state_of_a_hybrid_table_is_none_while_it_is_split(budget, captured):
    """A table split between device and host memory stages its host rows,
    whose number its step reads on the host: never captured."""
    options = [dataclasses.replace(o, local_hbm_for_values=budget) for o in _options()]
    m = unchecked_module(options, EmbOptimType.EXACT_SGD, "SUM", "cpu", 0.1)
    assert (m.storage.placement.remap is not None) == (not captured)
    assert (m._graph_state() is not None) == captured


def test_graph_state_is_none_under_debug_checks(monkeypatch):
    m = _storage_state()
    monkeypatch.setenv("DYNAMICEMB_DEBUG", "1")  # segmented_unique reads its offsets
    assert m._graph_state() is None


def test_graph_state_changes_when_the_tables_are_rebuilt():
    m = _storage_state()
    before = m._graph_state()
    m.rows.restore(m.rows.snapshot())
    assert m._graph_state() != before


@pytest.mark.parametrize(
    "kw, captured",
    [
        ({}, True),  # a host table at its capacity under the cache
        ({"init_capacity": 1024}, False),  # the host table can still grow
        ({"strategy": S.NO_EVICTION}, False),  # it grows without bound
    ],
)
def test_graph_state_of_a_cache_names_a_step_that_never_synchronizes(kw, captured):
    """A cache's training lookup over a host table at its capacity reads
    nothing on the host: captured; over a table that still grows, not."""
    strategy = kw.pop("strategy", S.TIMESTAMP)
    options = [
        dataclasses.replace(o, caching=True, local_hbm_for_values=256 * 64, **kw)
        for o in _options(strategy)
    ]
    m = unchecked_module(options, EmbOptimType.EXACT_SGD, "SUM", "cpu", 0.1)
    assert m.storage.has_cache
    assert (m._graph_state() is not None) == captured

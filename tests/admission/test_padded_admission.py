"""Frequency admission on padded batches (dynamicemb/embedding/admission.py):
the module's one-op path admits and rejects the same keys, counts the same
and gives the same rows and outputs, bit for bit, as the exact path, which a
reference admitter reaches through the spec's ``MultiTableAdmitter.admit``
alone; its step reads nothing from the device; its lookup may be captured in
a CUDA graph, recaptured when the counter's tensors are rebuilt; on a GPU it
equals the CPU module, never synchronizes and replays as it runs eagerly."""

import pytest
import torch

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
    MultiTableAdmitter,
    ProbabilisticAdmissionStrategy,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from tests.embedding.sync_guard import STEP_READS, HostSync, cuda_syncs_raise, forbid_host_syncs
from tests.embedding.tbe_batches import FEATURE_TABLES, random_batches, train_step, unchecked_module

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType
S = DynamicEmbScoreStrategy


class _Exact(MultiTableAdmitter):
    """The frequency admitter reached through ``admit`` alone: the module
    hands it the keys stored nowhere, an exact batch."""

    def __init__(self, inner):
        self.inner = inner

    def admit(self, keys, table_ids, frequencies=None):
        return self.inner.admit(keys, table_ids, frequencies)

    def state(self):
        return self.inner.state()

    @property
    def non_admitted_initializer(self):
        return self.inner.non_admitted_initializer


class _ExactFrequency(FrequencyAdmissionStrategy):
    @classmethod
    def create_admitter(cls, table_strategies, device):
        return _Exact(super().create_admitter(table_strategies, device))


def _module(
    device,
    strategy_cls=FrequencyAdmissionStrategy,
    threshold=2,
    pooling="SUM",
    dims=(8, 12),
    dtype=torch.float32,
    score=S.TIMESTAMP,
    rejected_init=None,
    optimizer="sgd",
    **kw,
):
    """Two tables of two initializers (two init groups), counters small
    enough to evict; ``rejected_init``: the strategy's own initializer."""
    inits = [
        DynamicEmbInitializerArgs(mode=Mode.NORMAL, std_dev=0.05),
        DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.2, upper=0.3),
    ]
    opts = []
    for t, d in enumerate(dims):
        args = {
            "max_capacity": 1024,
            "bucket_capacity": 64,
            "local_hbm_for_values": 1 << 24,
            **kw,
        }
        opts.append(
            DynamicEmbTableOptions(
                dim=d,
                score_strategy=score,
                embedding_dtype=dtype,
                initializer_args=inits[t],
                admit_strategy=strategy_cls(threshold, KVCounter(96, 16), rejected_init),
                **args,
            )
        )
    opt = EmbOptimType.ADAM if optimizer == "adam" else EmbOptimType.EXACT_SGD
    m = unchecked_module(opts, opt, pooling, device, 0.05)
    if score == S.CUSTOMIZED:
        m.set_score(7, [0])
        m.set_score(9, [1])
    return m


def _batches(device, steps, seed=0):
    return random_batches(device, steps, batch=48, vocab=700, seed=seed, weights=True)


def _rows_by_key(m):
    out = []
    for t in range(len(m.table_options)):
        chunks = list(m.rows.export_rows(t, 1 << 20))
        keys = torch.cat([c.keys for c in chunks]).cpu()
        emb = torch.cat([c.embeddings for c in chunks]).cpu()
        state = [c.optimizer_state for c in chunks]
        order = keys.argsort()
        state = None if state[0] is None else torch.cat(state).cpu()[order]
        out.append((keys[order], emb[order], state))
    return out


def _close(a, b):
    """Equal but for float rounding: float32 to 1e-5, and the embedding
    dtype's own tolerance (torch.testing's) for 16-bit rows."""
    if a.dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(a, b)
    return True


def _assert_same(got, want, exact=True):
    """The same stored keys, rows, counters, statistics and admission
    counter (rows bit for bit when ``exact``)."""
    same = torch.equal if exact else _close
    assert torch.equal(got.stats.counts.cpu(), want.stats.counts.cpu())
    assert torch.equal(got.insert_failures.cpu(), want.insert_failures.cpu())
    assert torch.equal(got.rows.hash_table.counters.cpu(), want.rows.hash_table.counters.cpu())
    for (gk, ge, gs), (wk, we, ws) in zip(_rows_by_key(got), _rows_by_key(want)):
        assert torch.equal(gk, wk)
        assert same(ge, we)
        assert (gs is None and ws is None) or same(gs, ws)
    for x, y in zip(got.admitter.state().state_tensors(), want.admitter.state().state_tensors()):
        assert torch.equal(x.cpu(), y.cpu())


CASES = {
    "sum": {},
    "none": {"pooling": "NONE", "dims": (8, 8)},
    "mean-adam": {"pooling": "MEAN", "optimizer": "adam"},
    "fp16-own-init": {
        "dtype": torch.float16,
        "rejected_init": DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-1.0, upper=1.0),
    },
    "bf16-threshold3": {"dtype": torch.bfloat16, "threshold": 3},
    "lfu-counters": {"score": S.LFU, "extra": "frequency_counters"},
    "threshold1-weights": {"threshold": 1, "extra": "pooling_weights"},
    "growing": {"init_capacity": 256, "max_capacity": 1024},
    "evicting": {"max_capacity": 128},
    "no-eviction": {"score": S.NO_EVICTION},
    "customized": {"score": S.CUSTOMIZED},
}


def _case(name):
    kw = dict(CASES[name])
    return kw.pop("extra", None), kw


@pytest.mark.parametrize("name", list(CASES))
def test_the_padded_path_trains_as_the_exact_path(name):
    extra, kw = _case(name)
    padded = _module("cpu", **kw)
    exact = _module("cpu", _ExactFrequency, **kw)
    assert padded._admission.padded and not exact._admission.padded
    for step, batch in enumerate(_batches("cpu", 6)):
        got, want = train_step(padded, batch, extra), train_step(exact, batch, extra)
        assert torch.equal(got, want), f"step {step}"
    counts = padded.stats.counts
    assert int(counts[:, 1].sum()) > 0  # admitted, and rejected below the threshold
    assert (int(counts[:, 2].sum()) > 0) == (kw.get("threshold", 2) > 1)
    _assert_same(padded, exact)


def test_a_step_with_frequency_admission_reads_nothing_from_the_device():
    m = _module("cpu", threshold=3)
    for batch in _batches("cpu", 4):
        with forbid_host_syncs(allow=STEP_READS):
            train_step(m, batch)
    assert int(m.stats.counts[:, 2].sum()) > 0


def test_the_proxy_catches_the_exact_path():
    """The guard is live: a module whose admitter takes exact batches reads
    the number of distinct keys."""
    m = _module("cpu", _ExactFrequency)
    with pytest.raises(HostSync):
        with forbid_host_syncs(allow=STEP_READS):
            train_step(m, _batches("cpu", 1)[0])


# ---------------------------------------------------- what may be captured --


def test_graph_state_covers_the_counter():
    m = _module("cpu")
    state = m._graph_state()
    assert state is not None and state == m._graph_state()
    counter = m.admitter.state().table
    counter.scores = counter.scores.clone()  # a rebuilt tensor
    assert m._graph_state() != state
    state = m._graph_state()
    m.admitter.threshold = 5
    assert m._graph_state() != state


@pytest.mark.parametrize(
    "strategy",
    [
        _ExactFrequency(2, KVCounter(96, 16)),
        ProbabilisticAdmissionStrategy(0.5),
    ],
)
def test_admitters_of_exact_batches_are_not_captured(strategy):
    opts = [
        DynamicEmbTableOptions(
            dim=8,
            max_capacity=1024,
            bucket_capacity=64,
            local_hbm_for_values=1 << 24,
            admit_strategy=strategy,
        )
        for _ in range(2)
    ]
    m = unchecked_module(opts, EmbOptimType.EXACT_SGD, "SUM", "cpu", 0.1)
    assert m._graph_state() is None


def test_a_cache_keeps_the_exact_path():
    from dynamicemb.dynamicemb_config import value_row_bytes

    m = _module(
        "cpu",
        caching=True,
        local_hbm_for_values=64 * value_row_bytes(EmbOptimType.EXACT_SGD, 12, torch.float32),
    )
    assert not m._admission.padded and m._graph_state() is None


# -------------------------------------------------------------------- GPU --


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_padded_admission_equals_the_cpu_module(name):
    extra, kw = _case(name)
    gpu, cpu = _module("cuda", **kw), _module("cpu", **kw)
    gpu.cuda_graphs = False
    for step, batch in enumerate(_batches("cuda", 6)):
        got = train_step(gpu, batch, extra)
        want = train_step(cpu, tuple(t.cpu() for t in batch), extra)
        # 16-bit rows may round apart by one unit after a float32 update.
        tol = (1e-5, 1e-6) if kw.get("dtype", torch.float32) == torch.float32 else (2e-2, 1e-3)
        torch.testing.assert_close(got.cpu(), want, rtol=tol[0], atol=tol[1], msg=f"step {step}")
    _assert_same(gpu, cpu, exact=False)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("name", ["sum", "lfu-counters", "fp16-own-init"])
def test_cuda_step_with_admission_never_synchronizes(name, graphs):
    extra, kw = _case(name)
    m = _module("cuda", threshold=3, **kw)
    m.cuda_graphs = graphs
    for step in range(5):
        batch = _fixed_shape_batch(step, "cuda")
        with cuda_syncs_raise():
            train_step(m, batch, extra)
    assert (m._graphs.replays > 0) == graphs
    assert int(m.stats.counts[:, 2].sum()) > 0


def _fixed_shape_batch(step, device, batch=64, hotness=2):
    """One shape at every step: ``hotness`` ids per bag."""
    g = torch.Generator().manual_seed(step)
    bags = len(FEATURE_TABLES) * batch
    keys = torch.randint(0, 3000, (bags * hotness,), generator=g)
    offsets = torch.arange(0, bags * hotness + 1, hotness)
    weights = torch.rand(keys.numel(), generator=g)
    return keys.to(device), offsets.to(device), weights.to(device)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sum", "mean-adam", "lfu-counters", "fp16-own-init"])
def test_replayed_lookups_with_admission_train_as_the_eager_lookup(name):
    extra, kw = _case(name)
    graphed, eager = _module("cuda", **kw), _module("cuda", **kw)
    eager.cuda_graphs = False
    for step in range(6):
        batch = _fixed_shape_batch(step, "cuda")
        got, want = train_step(graphed, batch, extra), train_step(eager, batch, extra)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=f"step {step}")
    assert graphed._graphs.captures == 1 and graphed._graphs.replays == 5
    assert eager._graphs.replays == 0
    _assert_same(graphed, eager, exact=False)


@pytest.mark.gpu
def test_rebuilt_counter_tensors_are_captured_again():
    graphed, eager = _module("cuda"), _module("cuda")
    eager.cuda_graphs = False
    for step in range(6):
        if step == 3:
            for m in (graphed, eager):
                t = m.admitter.state().table
                t.keys, t.scores = t.keys.clone(), t.scores.clone()
        batch = _fixed_shape_batch(step, "cuda")
        got, want = train_step(graphed, batch), train_step(eager, batch)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=f"step {step}")
    assert graphed._graphs.captures == 2
    _assert_same(graphed, eager, exact=False)

"""BatchedDynamicEmbeddingTablesV2 against a dense float64 model of the same
tables (rows created on first sight by the same initializer), over several
training steps, for each pooling mode and optimizer."""

import pytest
import torch

from dynamicemb import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbOptimType,
    DynamicEmbTableOptions,
)
from dynamicemb import (
    DynamicEmbInitializerMode as Mode,
)
from dynamicemb import (
    DynamicEmbPoolingMode as Pool,
)
from dynamicemb import (
    DynamicEmbScoreStrategy as Score,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2, init_rows
from dynamicemb.table import ScoredHashTable
from tests.devices import DEVICES
from tests.embedding.optimizer_reference import reference_step
from tests.table.table_model import bucket_hash

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType


def _opts(dims, **kw):
    return [
        DynamicEmbTableOptions(
            dim=d,
            max_capacity=1024,
            bucket_capacity=128,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.1, upper=0.1),
            **kw,
        )
        for d in dims
    ]


def _batch(g, num_features, batch, vocab):
    lengths = torch.randint(0, 4, (num_features * batch,), generator=g)  # empty bags too
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, vocab, (int(lengths.sum()),), generator=g)
    return indices, offsets


class Dense:
    """The reference: a dict of float64 rows per table, updated by the rules."""

    def __init__(self, module, dims, feature_table_map):
        self.m, self.dims, self.ftm = module, dims, feature_table_map
        self.rows, self.state = {}, {}

    def row(self, t, k):
        if (t, k) not in self.rows:
            a = self.m.table_options[t].initializer_args
            self.rows[(t, k)] = init_rows(
                torch.tensor([k]), self.dims[t], a, torch.tensor([t]), self.m.seed
            )[0].double()
            self.state[(t, k)] = torch.zeros(
                self.m.optimizer.state_dim(self.dims[t]), dtype=torch.float64
            )
        return self.rows[(t, k)]

    def forward_backward(self, indices, offsets, pooling, grad, weights, step):
        F = len(self.ftm)
        B = (offsets.numel() - 1) // F
        outs, grads = [], {}
        for f in range(F):
            t, d = self.ftm[f], self.dims[self.ftm[f]]
            for b in range(B):
                lo, hi = int(offsets[f * B + b]), int(offsets[f * B + b + 1])
                n = hi - lo
                acc = torch.zeros(d, dtype=torch.float64)
                for j in range(lo, hi):
                    k = int(indices[j])
                    w = 1.0 if weights is None else float(weights[j])
                    if pooling == Pool.MEAN:
                        w = 1.0 / n
                    if pooling == Pool.NONE:
                        outs.append((j, self.row(t, k).clone()))
                        g = grad[j, :d].double()
                    else:
                        acc += w * self.row(t, k)
                        g = (
                            w
                            * grad[b, sum(self.dims[self.ftm[x]] for x in range(f)) :][:d].double()
                        )
                    grads[(t, k)] = grads.get((t, k), 0) + g
                if pooling != Pool.NONE:
                    outs.append(((f, b), acc))
        for (t, k), g in grads.items():
            w, s = reference_step(self.m.optimizer, self.rows[(t, k)], self.state[(t, k)], g, step)
            self.rows[(t, k)] = w
            self.state[(t, k)] = s[: self.state[(t, k)].numel()]
        return outs


def _dense_output(outs, pooling, dims, ftm, batch, n_indices):
    if pooling == Pool.NONE:
        out = torch.zeros(n_indices, dims[0], dtype=torch.float64)
        for j, v in outs:
            out[j] = v
        return out
    cols = [dims[ftm[f]] for f in range(len(ftm))]
    out = torch.zeros(batch, sum(cols), dtype=torch.float64)
    for (f, b), v in outs:
        out[b, sum(cols[:f]) : sum(cols[:f]) + cols[f]] = v
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pooling", [Pool.SUM, Pool.MEAN, Pool.NONE])
@pytest.mark.parametrize(
    "optimizer,kw",
    [
        (EmbOptimType.EXACT_SGD, dict(learning_rate=0.3)),
        (EmbOptimType.ADAM, dict(learning_rate=0.05)),
        (EmbOptimType.EXACT_ADAGRAD, dict(learning_rate=0.2)),
        (
            EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            dict(learning_rate=0.2, weight_decay=0.01, weight_decay_mode=1),
        ),
        (
            DynamicEmbOptimType.FTRL,
            dict(learning_rate=0.5, l1_reg=0.001, l2_reg=0.01, ftrl_beta=1.0),
        ),
        (
            DynamicEmbOptimType.ROWWISE_RMSPROP_AR,
            dict(learning_rate=0.2, ar_alpha=0.4, row_warmup_steps=3),
        ),
    ],
    ids=["sgd", "adam", "adagrad", "rowwise", "ftrl", "rmsprop_ar"],
)
def test_ten_steps_match_the_dense_reference(device, pooling, optimizer, kw):
    dims = [4, 4] if pooling == Pool.NONE else [4, 8]
    ftm = [0, 1, 0]
    m = BatchedDynamicEmbeddingTablesV2(_opts(dims), ftm, pooling, optimizer, device=device, **kw)
    ref = Dense(m, dims, ftm)
    g = torch.Generator().manual_seed(3)
    B = 5
    for step in range(1, 11):
        indices, offsets = _batch(g, len(ftm), B, 40)
        out = m(indices.to(device), offsets.to(device))
        grad = torch.randn(out.shape, generator=g)
        want = _dense_output(
            ref.forward_backward(indices, offsets, pooling, grad, None, step),
            pooling,
            dims,
            ftm,
            B,
            indices.numel(),
        )
        assert torch.allclose(out.detach().cpu().double(), want, rtol=1e-5, atol=1e-6), step
        out.backward(grad.to(device))


def test_weighted_sum_matches_the_dense_reference():
    dims, ftm = [4, 8], [0, 1]
    m = BatchedDynamicEmbeddingTablesV2(
        _opts(dims), ftm, Pool.SUM, EmbOptimType.EXACT_SGD, learning_rate=0.5
    )
    ref = Dense(m, dims, ftm)
    g = torch.Generator().manual_seed(4)
    for step in range(1, 6):
        indices, offsets = _batch(g, 2, 4, 30)
        w = torch.rand(indices.numel(), generator=g)
        out = m(indices, offsets, pooling_weights=w)
        grad = torch.randn(out.shape, generator=g)
        want = _dense_output(
            ref.forward_backward(indices, offsets, Pool.SUM, grad, w, step),
            Pool.SUM,
            dims,
            ftm,
            4,
            0,
        )
        assert torch.allclose(out.detach().double(), want, rtol=1e-5, atol=1e-6)
        out.backward(grad)


@pytest.mark.parametrize("pooling", [Pool.SUM, Pool.NONE])
def test_debug_init_sgd_lr_one_unit_grads_lower_each_row_by_its_count(pooling):
    opts = [
        DynamicEmbTableOptions(
            dim=3, max_capacity=256, initializer_args=DynamicEmbInitializerArgs(mode=Mode.DEBUG)
        )
    ]
    m = BatchedDynamicEmbeddingTablesV2(
        opts, None, pooling, EmbOptimType.EXACT_SGD, learning_rate=1.0
    )
    indices = torch.tensor([10, 11, 10, 10, 12])
    offsets = torch.tensor([0, 2, 5])
    m(indices, offsets).sum().backward()
    m.eval()
    with torch.no_grad():
        out = (
            m(torch.tensor([10, 11, 12]), torch.tensor([0, 1, 2, 3]))
            if pooling == Pool.SUM
            else m(torch.tensor([10, 11, 12]), torch.tensor([0, 3]))
        )
    assert out[:, 0].tolist() == [10 - 3, 11 - 1, 12 - 1]


def test_eval_reads_the_eval_initializer_and_inserts_nothing():
    opts = _opts([4])
    m = BatchedDynamicEmbeddingTablesV2(opts, None, Pool.SUM, EmbOptimType.EXACT_SGD)
    m(torch.tensor([1, 2]), torch.tensor([0, 2]))
    size = int(m.rows.hash_table.size()[0])
    m.eval()
    with torch.no_grad():
        out = m(torch.tensor([99, 98]), torch.tensor([0, 1, 2]))
    assert torch.equal(out, torch.zeros(2, 4))
    assert int(m.rows.hash_table.size()[0]) == size
    opts2 = [
        DynamicEmbTableOptions(
            dim=4,
            max_capacity=256,
            eval_initializer_args=DynamicEmbInitializerArgs(mode=Mode.CONSTANT, value=0.5),
        )
    ]
    m2 = BatchedDynamicEmbeddingTablesV2(opts2, None, Pool.SUM, EmbOptimType.EXACT_SGD).eval()
    with torch.no_grad():
        assert torch.equal(m2(torch.tensor([5]), torch.tensor([0, 1])), torch.full((1, 4), 0.5))
    assert int(m2.rows.hash_table.size()[0]) == 0


def test_weighted_pooling_errors():
    m = BatchedDynamicEmbeddingTablesV2(_opts([4]), None, Pool.SUM, EmbOptimType.EXACT_SGD)
    idx, off = torch.tensor([1, 2]), torch.tensor([0, 2])
    with pytest.raises(ValueError, match="float32"):
        m(idx, off, pooling_weights=torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="3 entries for 2 indices"):
        m(idx, off, pooling_weights=torch.ones(3))
    with pytest.raises(ValueError, match="require grad"):
        m(idx, off, pooling_weights=torch.ones(2, requires_grad=True))
    with torch.no_grad():
        m(idx, off, pooling_weights=torch.ones(2, requires_grad=True))  # accepted
    with pytest.raises(ValueError, match="either pooling_weights or frequency_counters"):
        m(
            idx,
            off,
            frequency_counters=torch.ones(2, dtype=torch.int64),
            pooling_weights=torch.ones(2),
        )
    mean = BatchedDynamicEmbeddingTablesV2(_opts([4]), None, Pool.MEAN, EmbOptimType.EXACT_SGD)
    with pytest.raises(ValueError, match="SUM, got MEAN"):
        mean(idx, off, pooling_weights=torch.ones(2))


def test_scores_follow_the_strategy():
    step = BatchedDynamicEmbeddingTablesV2(
        _opts([2], score_strategy=Score.STEP), None, Pool.SUM, EmbOptimType.EXACT_SGD
    )
    for _ in range(3):
        step(torch.tensor([7]), torch.tensor([0, 1]))
    slot = step.rows.hash_table.find(torch.tensor([7]))
    assert int(step.rows.hash_table.scores[slot, 0]) == 3
    lfu = BatchedDynamicEmbeddingTablesV2(
        _opts([2], score_strategy=Score.LFU), None, Pool.SUM, EmbOptimType.EXACT_SGD
    )
    lfu(torch.tensor([7, 7, 8]), torch.tensor([0, 3]))
    lfu(torch.tensor([7]), torch.tensor([0, 1]), frequency_counters=torch.tensor([5]))
    assert lfu.rows.hash_table.scores[
        lfu.rows.hash_table.find(torch.tensor([7, 8])), 0
    ].tolist() == [7, 1]
    cst = BatchedDynamicEmbeddingTablesV2(
        _opts([2], score_strategy=Score.CUSTOMIZED), None, Pool.SUM, EmbOptimType.EXACT_SGD
    )
    with pytest.raises(RuntimeError, match="set_score"):
        cst(torch.tensor([1]), torch.tensor([0, 1]))
    cst.set_score(42)
    cst(torch.tensor([1]), torch.tensor([0, 1]))
    assert int(cst.rows.hash_table.scores[cst.rows.hash_table.find(torch.tensor([1])), 0]) == 42
    with pytest.warns(UserWarning, match="less than"):
        cst.set_score(41)


def test_safe_check_error_reports_the_failed_keys():
    opts = [
        DynamicEmbTableOptions(
            dim=2, max_capacity=16, bucket_capacity=16, safe_check_mode=DynamicEmbCheckMode.ERROR
        )
    ]
    m = BatchedDynamicEmbeddingTablesV2(opts, None, Pool.SUM, EmbOptimType.EXACT_SGD)
    with pytest.raises(RuntimeError, match="3 keys could not be inserted"):
        m(torch.arange(19), torch.tensor([0, 19]))
    opts[0].safe_check_mode = DynamicEmbCheckMode.WARNING
    w = BatchedDynamicEmbeddingTablesV2(opts, None, Pool.NONE, EmbOptimType.EXACT_SGD)
    with pytest.warns(UserWarning, match="3 keys could not be inserted"):
        out = w(torch.arange(19), torch.tensor([0, 19]))
    assert int((out.abs().sum(1) == 0).sum()) >= 3
    assert int(w.insert_failures.sum()) == 3


def test_rows_survive_table_expansion():
    opts = [
        DynamicEmbTableOptions(
            dim=4,
            init_capacity=128,
            max_capacity=4096,
            bucket_capacity=128,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.DEBUG),
        )
    ]
    m = BatchedDynamicEmbeddingTablesV2(
        opts, None, Pool.NONE, EmbOptimType.EXACT_SGD, learning_rate=1.0
    )
    first = torch.arange(50)
    m(first, torch.tensor([0, 50])).sum().backward()  # every row lowered by 1
    assert m.rows.hash_table.capacity() == 128
    more = torch.arange(1000, 1900)
    m(more, torch.tensor([0, 900]))  # forces doubling past 128 slots
    assert m.rows.hash_table.capacity() >= 2048
    m.eval()
    with torch.no_grad():
        out = m(first, torch.tensor([0, 50]))
    assert out[:, 0].tolist() == [float(k - 1) for k in range(50)]


# ------------------------------------------------------------ NO_EVICTION --


def _no_eviction_opts(dims, init_capacity, bucket_capacity=16):
    return [
        DynamicEmbTableOptions(
            dim=d,
            init_capacity=init_capacity,
            max_capacity=init_capacity,
            bucket_capacity=bucket_capacity,
            score_strategy=Score.NO_EVICTION,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.1, upper=0.1),
        )
        for d in dims
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "optimizer,kw",
    [
        (EmbOptimType.EXACT_SGD, dict(learning_rate=0.3)),
        (EmbOptimType.ADAM, dict(learning_rate=0.05)),
    ],
    ids=["sgd", "adam"],
)
def test_no_eviction_keeps_every_key_and_its_trained_row_across_expansions(device, optimizer, kw):
    dims, ftm = [4, 8], [0, 1, 0]
    m = BatchedDynamicEmbeddingTablesV2(
        _no_eviction_opts(dims, 32), ftm, Pool.SUM, optimizer, device=device, **kw
    )
    # Key map at load 0.5 of init_capacity, rows = init_capacity.
    assert [m.rows.hash_table.capacity(t) for t in range(2)] == [64, 64]
    assert [m.rows.hash_table.row_capacity(t) for t in range(2)] == [32, 32]
    ref = Dense(m, dims, ftm)
    g = torch.Generator().manual_seed(11)
    B, vocab = 16, 5000  # far more distinct keys than the 32 initial rows
    for step in range(1, 13):
        indices, offsets = _batch(g, len(ftm), B, vocab)
        out = m(indices.to(device), offsets.to(device))
        grad = torch.randn(out.shape, generator=g)
        want = _dense_output(
            ref.forward_backward(indices, offsets, Pool.SUM, grad, None, step),
            Pool.SUM,
            dims,
            ftm,
            B,
            indices.numel(),
        )
        assert torch.allclose(out.detach().cpu().double(), want, rtol=1e-5, atol=1e-6), step
        out.backward(grad.to(device))
    seen = {t: sorted(k for (tt, k) in ref.rows if tt == t) for t in range(2)}
    assert int(m.insert_failures.sum()) == 0
    assert int(m.rows.hash_table.counter("EVICTIONS").sum()) == 0
    for t in range(2):
        assert int(m.rows.hash_table.size()[t]) == len(seen[t])
        assert len(seen[t]) > 4 * 32
        # Doubled together: the key map stays at twice the rows, load <= 0.5.
        assert m.rows.hash_table.capacity(t) == 2 * m.rows.hash_table.row_capacity(t)
        assert m.rows.hash_table.row_capacity(t) >= len(seen[t])
    # Every key ever seen reads back its trained row.
    m.eval()
    with torch.no_grad():
        for t in range(2):
            f = ftm.index(t)
            keys = torch.tensor(seen[t])
            lengths = torch.zeros(len(ftm), keys.numel(), dtype=torch.int64)
            lengths[f] = 1
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
            out = m(keys.to(device), offsets.to(device)).cpu().double()
            col = sum(dims[ftm[x]] for x in range(f))
            want = torch.stack([ref.rows[(t, int(k))] for k in keys])
            assert torch.allclose(out[:, col : col + dims[t]], want, rtol=1e-5, atol=1e-6)


def test_no_eviction_grows_only_the_table_that_needs_it():
    m = BatchedDynamicEmbeddingTablesV2(
        _no_eviction_opts([4, 4], 64, 32), [0, 1], Pool.SUM, EmbOptimType.EXACT_SGD
    )
    before = [(m.rows.hash_table.capacity(t), m.rows.hash_table.row_capacity(t)) for t in range(2)]
    # 200 keys for table 0, 3 for table 1 (feature f's bags are offsets[f*B : (f+1)*B+1]).
    indices = torch.cat([torch.arange(200), torch.arange(3)])
    m(indices, torch.tensor([0, 200, 203]))
    assert (m.rows.hash_table.capacity(1), m.rows.hash_table.row_capacity(1)) == before[1]
    assert m.rows.hash_table.row_capacity(0) >= 200 and m.rows.hash_table.capacity(
        0
    ) == 2 * m.rows.hash_table.row_capacity(0)
    # Rows are allocated per table: the grown table's rows and the other's.
    rows = m.rows.hash_table.row_capacity(0) + m.rows.hash_table.row_capacity(1)
    assert m.storage.footprint().host == rows * m.layout.row_bytes[0]


def _home_bucket(key, capacity, width):
    """The table's addressing (cc/table/hash.h): the bucket hash, then the bucket."""
    return (bucket_hash(key) % capacity) // width


def test_no_eviction_full_bucket_below_half_load_grows_instead_of_failing():
    # 40 keys that all hash into one 16-slot bucket overflow it long before
    # the key map's load reaches 0.5: the table grows and stores all of them.
    m = BatchedDynamicEmbeddingTablesV2(
        _no_eviction_opts([2], 512, 16), None, Pool.NONE, EmbOptimType.EXACT_SGD
    )
    cap = m.rows.hash_table.capacity()
    same = torch.tensor([k for k in range(1, 100000) if _home_bucket(k, cap, 16) == 0][:40])
    assert same.numel() == 40
    out = m(same, torch.tensor([0, 40]))
    assert int(m.insert_failures.sum()) == 0
    assert m.rows.hash_table.capacity() > cap
    assert int(m.rows.hash_table.size()[0]) == 40
    assert bool((out.abs().sum(1) > 0).all())
    # The home-bucket model is the table's: at the initial capacity they collide.
    t = ScoredHashTable([cap], bucket_capacities=16)
    res = t.insert(same)
    assert int((res.status == 3).sum()) == 24


def test_no_eviction_out_of_memory_warns_and_training_continues(monkeypatch):
    m = BatchedDynamicEmbeddingTablesV2(
        _no_eviction_opts([4], 16), None, Pool.NONE, EmbOptimType.EXACT_SGD, learning_rate=1.0
    )

    def no_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")

    monkeypatch.setattr(m.rows.hash_table, "relayout", no_memory)
    with pytest.warns(UserWarning, match="out of memory"):
        out = m(torch.arange(40), torch.tensor([0, 40]))
    out.sum().backward()  # the step completes
    assert m.rows.hash_table.row_capacity() == 16
    assert m.storage.footprint().host == 16 * m.layout.row_bytes[0]
    assert int(m.rows.hash_table.size()[0]) == 16  # the rows there are, the rest not stored
    assert int(m.insert_failures.sum()) == 24
    stored = out.abs().sum(1) > 0
    assert int(stored.sum()) == 16
    monkeypatch.undo()
    m(torch.arange(100, 140), torch.tensor([0, 40]))  # memory back: it grows again
    assert m.rows.hash_table.row_capacity() >= 56 and int(m.rows.hash_table.size()[0]) == 56


def test_no_eviction_cannot_be_fused_with_an_evicting_table():
    opts = _no_eviction_opts([4], 64) + _opts([4])
    with pytest.raises(ValueError, match="share one score_strategy"):
        BatchedDynamicEmbeddingTablesV2(opts, None, Pool.SUM, EmbOptimType.EXACT_SGD)

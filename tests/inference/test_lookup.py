"""InferenceEmbeddingTable against float64 math over the rows the trained
tables held (read from their hash tables, not through the checkpoint):
pooled SUM, weighted SUM, MEAN and sequence lookups of ids the tables hold
and ids they never saw, in every row format, each within its quantization
error bound computed from the rows themselves; checkpoints of one and two
ranks, float32 and bfloat16 rows; a KeyedJaggedTensor's features in any
order; default rows (zeros, CONSTANT, and a random initializer's, against
the training module's eval lookup)."""

import pytest
import torch

from dynamicemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, DynamicEmbPoolingMode
from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
from tests.inference import inference_harness as ih

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int8]
P = DynamicEmbPoolingMode


def value_bound(dtype: torch.dtype, rows: torch.Tensor) -> torch.Tensor:
    """Per value of ``rows`` ((n, dim) float64), how far the stored value may
    be from it (formats.py states the bounds; computed here from the rows)."""
    a = rows.abs()
    if dtype == torch.float32:
        err = torch.zeros_like(rows)
    elif dtype == torch.float16:
        err = a * 2.0**-11 + 2.0**-25
    elif dtype == torch.bfloat16:
        err = a * 2.0**-8 + 2.0**-133
    elif dtype == torch.float8_e4m3fn:
        scale = a.amax(dim=1, keepdim=True) / 448.0
        err = torch.maximum(a * 2.0**-4, scale * 2.0**-10)
    else:
        step = (rows.amax(dim=1, keepdim=True) - rows.amin(dim=1, keepdim=True)) / 255.0
        err = (step / 2).expand_as(rows)
    return err * (1 + 2.0**-20) + a * 2.0**-22 + 1e-12


def _bound(dtype, rows, ids, offsets, weights, mode, names):
    """Per output value, the pooled quantization bound (float32 accumulation
    included): the pooling of each id's value bound, weights made positive."""
    zeros = [lambda k, d=rows[n]["emb"].shape[1]: torch.zeros(k.numel(), d) for n in names]
    per_id = ih.rows_per_id(rows, names, ids, offsets, zeros)
    bounds = [value_bound(dtype, r[None])[0] + r.abs() * 2.0**-21 for r in per_id]
    w = None if weights is None else weights.abs()
    dims = [rows[n]["emb"].shape[1] for n in names]
    return ih.pool(bounds, offsets, w, mode, dims) + (1e-7 if mode == "none" else 1e-6)


def _zero_defaults(rows, names):
    return [lambda k, d=rows[n]["emb"].shape[1]: torch.zeros(k.numel(), d) for n in names]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("mode", ["sum", "weighted", "mean"])
def test_pooled_lookups_match_float64_math_within_the_format_bound(job, dtype, mode):
    cs, path, rows = job
    names = [t.name for t in cs.tables]
    pooling = P.MEAN if mode == "mean" else P.SUM
    configs = [InferenceTableConfig(n, feature_names=f) for n, f in ih.features(cs).items()]
    table = InferenceEmbeddingTable.from_checkpoint(path, configs, dtype=dtype, pooling=pooling)
    assert table.sizes() == {n: rows[n]["keys"].numel() for n in names}
    for seed in range(3):
        ids, offsets, weights = ih.batch(len(names), 6, seed)
        w = weights if mode == "weighted" else None
        got = table(ids, offsets, w)
        ref_mode = "mean" if mode == "mean" else "sum"
        want = ih.reference(rows, names, ids, offsets, w, ref_mode, _zero_defaults(rows, names))
        bound = _bound(dtype, rows, ids, offsets, w, ref_mode, names)
        assert got.dtype == torch.float32 and got.shape == want.shape
        excess = (got.double() - want).abs() - bound
        assert float(excess.max()) <= 0, (dtype, mode, float(excess.max()))
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def _ops_of(fn) -> set[str]:
    """The names of the ops the profiler saw ``fn`` run."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn], ids=lambda d: str(d)[6:]
)
def test_two_byte_and_fp8_rows_are_pooled_as_stored_in_one_pass(job, dtype):
    """The extension's embedding_pool reads the stored rows (no float32 copy
    of the batch's rows pooled by embedding_bag), and sums what decoding
    them first gives, within float32 rounding."""
    cs, path, rows = job
    names = [t.name for t in cs.tables]
    configs = [InferenceTableConfig(n, feature_names=f) for n, f in ih.features(cs).items()]
    table = InferenceEmbeddingTable.from_checkpoint(path, configs, dtype=dtype)
    ids, offsets, weights = ih.batch(len(names), 6, 4)
    seen = _ops_of(lambda: table(ids, offsets, weights))
    assert "dynamicemb::embedding_pool" in seen
    assert "aten::embedding_bag" not in seen and "aten::_embedding_bag" not in seen
    # Each id's stored row decoded (table.rows), then pooled in float64.
    none_held = {n: {"keys": rows[n]["keys"][:0], "emb": rows[n]["emb"][:0]} for n in names}
    stored = [lambda k, n=n: table.rows(n, k) for n in names]
    want = ih.reference(none_held, names, ids, offsets, weights, "sum", stored)
    got = table(ids, offsets, weights).double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_sequence_lookups_read_each_row_within_the_format_bound(job, dtype):
    cs, path, rows = job
    names = ["t0", "t1"]  # one dim
    configs = [InferenceTableConfig(n, feature_names=[f"f_{n}"]) for n in names]
    table = InferenceEmbeddingTable.from_checkpoint(path, configs, dtype=dtype, pooling=P.NONE)
    ids, offsets, _ = ih.batch(2, 8, 11)
    got = table(ids, offsets)
    want = ih.reference(rows, names, ids, offsets, None, "none", _zero_defaults(rows, names))
    bound = _bound(dtype, rows, ids, offsets, None, "none", names)
    assert got.shape == want.shape
    assert float(((got.double() - want).abs() - bound).max()) <= 0
    # A table's rows, by key: stored values within the bound, unknown keys zeros.
    keys = torch.cat([rows["t1"]["keys"], torch.tensor([10**12, -(10**12)])])
    got = table.rows("t1", keys)
    assert torch.equal(got[-2:], torch.zeros(2, 8))
    err = (got[:-2].double() - rows["t1"]["emb"]).abs() - value_bound(dtype, rows["t1"]["emb"])
    assert float(err.max()) <= 0


def test_a_bfloat16_checkpoint_of_one_rank_converts_to_every_format(bf16_job):
    cs, path, rows = bf16_job
    names = [t.name for t in cs.tables]
    for dtype in DTYPES:
        table = InferenceEmbeddingTable.from_checkpoint(
            path, [InferenceTableConfig(n, feature_names=[f"f_{n}"]) for n in names], dtype=dtype
        )
        ids, offsets, weights = ih.batch(3, 5, 4)
        got = table(ids, offsets, weights)
        want = ih.reference(rows, names, ids, offsets, weights, "sum", _zero_defaults(rows, names))
        bound = _bound(dtype, rows, ids, offsets, weights, "sum", names)
        assert float(((got.double() - want).abs() - bound).max()) <= 0, dtype
        if dtype in (torch.float32, torch.bfloat16):  # exact: the rows are bfloat16
            keys, stored = table.stored_rows("t0")
            assert torch.equal(keys, rows["t0"]["keys"])
            assert torch.equal(stored.double(), rows["t0"]["emb"])


def test_a_keyed_jagged_tensor_in_any_feature_order_reads_as_the_tbe_input(job):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    cs, path, rows = job
    table = InferenceEmbeddingTable.from_checkpoint(
        path,
        [InferenceTableConfig(n, feature_names=f) for n, f in ih.features(cs).items()],
        dtype=torch.int8,
    )
    ids, offsets, weights = ih.batch(3, 4, 5)
    want = table(ids, offsets, weights)
    lengths = (offsets[1:] - offsets[:-1]).view(3, 4)
    values = [ids[int(offsets[f * 4]) : int(offsets[(f + 1) * 4])] for f in range(3)]
    wts = [weights[int(offsets[f * 4]) : int(offsets[(f + 1) * 4])] for f in range(3)]
    order = [2, 0, 1]  # and one feature the table does not have
    extra = torch.tensor([5, 6, 7])
    kjt = KeyedJaggedTensor(
        keys=[f"f_t{f}" for f in order] + ["f_other"],
        values=torch.cat([values[f] for f in order] + [extra]),
        lengths=torch.cat([lengths[f] for f in order] + [torch.tensor([1, 1, 1, 0])]),
        weights=torch.cat([wts[f] for f in order] + [torch.ones(3)]),
    )
    out = table(kjt)
    assert out.keys() == ["f_t0", "f_t1", "f_t2"]
    assert out.length_per_key() == [8, 8, 4]
    torch.testing.assert_close(out.values(), want, rtol=0, atol=1e-6)


def test_sequence_lookups_of_a_keyed_jagged_tensor_give_jagged_rows(job):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    cs, path, rows = job
    table = InferenceEmbeddingTable.from_checkpoint(
        path, [InferenceTableConfig("t0", feature_names=["a"])], pooling=P.NONE
    )
    kjt = KeyedJaggedTensor(
        keys=["a"], values=rows["t0"]["keys"][:5], lengths=torch.tensor([2, 0, 3])
    )
    out = table(kjt)
    assert list(out) == ["a"]
    assert torch.equal(out["a"].lengths(), torch.tensor([2, 0, 3]))
    assert torch.equal(out["a"].values().double(), rows["t0"]["emb"][:5])


def test_unknown_keys_read_zeros_or_the_constant_default(job):
    cs, path, rows = job
    configs = [
        InferenceTableConfig("t0", feature_names=["a"]),
        InferenceTableConfig(
            "t2",
            feature_names=["b"],
            default=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.25),
        ),
    ]
    for dtype in DTYPES:
        table = InferenceEmbeddingTable.from_checkpoint(path, configs, dtype=dtype, pooling=P.MEAN)
        unknown = torch.tensor([10**15, 10**15 + 1, -(10**15)])
        ids = torch.cat([unknown, unknown])
        offsets = torch.tensor([0, 3, 6])
        got = table(ids, offsets)
        assert torch.equal(got[0, :8], torch.zeros(8))
        torch.testing.assert_close(got[0, 8:], torch.full((4,), 0.25), rtol=2.0**-4, atol=0)
        assert table.sizes() == {"t0": rows["t0"]["keys"].numel(), "t2": rows["t2"]["keys"].numel()}


def _training_eval_rows(keys, dims, args, init_ids):
    """The rows an eval lookup of the training module gives keys it does not
    hold (sequence mode, one feature per table)."""
    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

    options = [
        DynamicEmbTableOptions(
            dim=d, max_capacity=1024, bucket_capacity=128, eval_initializer_args=args
        )
        for d in dims
    ]
    module = BatchedDynamicEmbeddingTablesV2(
        options, pooling_mode=P.NONE, initializer_table_ids=init_ids
    )
    module.eval()
    ids = torch.cat([keys] * len(dims))
    offsets = torch.arange(ids.numel() + 1)
    with torch.no_grad():
        return module(ids, offsets).view(len(dims), keys.numel(), -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8], ids=["float32", "int8"])
def test_unknown_keys_read_the_eval_initializers_rows_of_the_training_module(dtype):
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.3, upper=0.2)
    keys = torch.tensor([3, 77, 10**9, -12, 5])
    want = _training_eval_rows(keys, [6, 6], args, [4, 9])
    table = InferenceEmbeddingTable(
        [
            InferenceTableConfig("x", 6, default=args, initializer_table_id=4),
            InferenceTableConfig("y", 6, default=args, initializer_table_id=9),
        ],
        pooling=P.NONE,
        dtype=dtype,
    )
    ids = torch.cat([keys, keys])
    got = table(ids, torch.arange(ids.numel() + 1)).view(2, keys.numel(), 6)
    assert torch.equal(got, want)
    assert torch.equal(table.rows("y", keys), want[1])
    assert float(want.abs().max()) > 0  # not zeros: the test can fail
    pooled = InferenceEmbeddingTable(
        [InferenceTableConfig("x", 6, default=args, initializer_table_id=4)], dtype=dtype
    )
    w = torch.tensor([0.5, -1.0, 2.0, 1.0, 1.0])
    got = pooled(keys, torch.tensor([0, 3, 5]), w)
    want_x = want[0].double() * w[:, None].double()
    torch.testing.assert_close(got.double(), torch.stack([want_x[:3].sum(0), want_x[3:].sum(0)]))

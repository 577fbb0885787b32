"""The pooling ops (embedding_pool, embedding_update) against plain torch.

The references are written out with index_add_ and the optimizer's equations;
CUDA cases compare the CUDA kernels with the CPU ones on the same inputs. Most
batches keep float32 rows of one width in one segment; the row-space cases
split them over two segments and store float16 / bfloat16 embeddings.
"""

import pytest
import torch

from dynamicemb import DynamicEmbOptimType
from dynamicemb.embedding import RowOptimizer
from dynamicemb.table import constants, ops
from tests.devices import DEVICES

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType

SGD, ADAM, ADAGRAD, ROWWISE = (
    EmbOptimType.EXACT_SGD,
    EmbOptimType.ADAM,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
)
FTRL = DynamicEmbOptimType.FTRL


def element_type(dtype) -> int:
    names = {torch.float32: "FLOAT32", torch.float16: "FLOAT16", torch.bfloat16: "BFLOAT16"}
    return int(constants()["ElementType"][names[dtype]])


F32 = element_type(torch.float32)


def space(t):
    """The batch's (num_rows, width) float32 values as a one-segment row
    space, and its rows as byte offsets into it (-1 stays -1)."""
    v = t["values"]
    offsets = torch.where(t["rows"] >= 0, t["rows"] * (v.shape[1] * 4), -1)
    return v, v.new_empty(0), offsets


def batch(device, seed=0, dims=(4, 8, 4), B=5, num_rows=40, width=24, weighted=True):
    """A random pooled batch over features of `dims`, keys mapped to rows."""
    g = torch.Generator().manual_seed(seed)
    F = len(dims)
    lengths = torch.randint(0, 4, (F * B,), generator=g)
    n = int(lengths.sum())
    offsets = torch.zeros(F * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    bag = torch.repeat_interleave(torch.arange(F * B), lengths)
    # Key u belongs to feature u % F (a key's occurrences share its table's dim).
    U = F * max(n // (2 * F), 1)
    inverse = F * torch.randint(0, U // F, (n,), generator=g) + bag // B
    rows = torch.randperm(num_rows, generator=g)[:U]
    rows[0] = -1  # a key whose insert failed: zeros, never updated
    values = torch.randn(num_rows, width, generator=g)
    weights = torch.rand(n, generator=g) if weighted else None
    dims_t = torch.tensor(dims)
    cols = torch.cumsum(torch.tensor((0,) + tuple(dims[:-1])), 0)
    t = dict(
        values=values,
        rows=rows,
        inverse=inverse,
        offsets=offsets,
        weights=weights,
        cols=cols,
        dims=dims_t,
        B=B,
        width=int(sum(dims)),
        bag=bag,
    )
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


def reference_pool(t):
    """out[b % B, cols[f] : cols[f] + dims[f]] = sum of w_j * values[rows[inverse[j]]]."""
    B = t["B"]
    out = torch.zeros(B, t["width"], dtype=torch.float64)
    for j in range(t["inverse"].numel()):
        r = int(t["rows"][t["inverse"][j]])
        if r < 0:
            continue
        b = int(t["bag"][j])
        f, i = divmod(b, B)
        c, d = int(t["cols"][f]), int(t["dims"][f])
        w = 1.0 if t["weights"] is None else float(t["weights"][j])
        out[i, c : c + d] += w * t["values"][r, :d].double().cpu()
    return out


def pool_args(t, seg=None, out_width=None, fill=None):
    """The arguments of embedding_pool for batch ``t`` (``fill``: its fill rows)."""
    seg0, seg1, rows = space(t) if seg is None else seg[:3]
    return (
        seg0,
        seg1,
        rows,
        t["inverse"],
        t["offsets"],
        t["weights"],
        t["cols"],
        t["dims"],
        t["B"],
        t["width"] if out_width is None else out_width,
        F32 if seg is None else seg[3],
        fill,
    )


def pool(t, seg=None, fill=None):
    return ops().embedding_pool(*pool_args(t, seg, fill=fill))


def occurrences(t):
    order = torch.argsort(t["inverse"], stable=True)
    counts = torch.bincount(t["inverse"], minlength=t["rows"].numel())
    occ = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
    occ[1:] = torch.cumsum(counts, 0)
    return occ, order


def update_args(t, grad, occ, order, optimizer=SGD, lr=0.1, step=1, wd=0.0, wd_mode=0, seg=None):
    """The arguments of embedding_update for batch ``t``."""
    opt = RowOptimizer(optimizer, learning_rate=lr, weight_decay=wd, weight_decay_mode=wd_mode)
    seg0, seg1, rows = space(t) if seg is None else seg[:3]
    return (
        seg0,
        seg1,
        grad,
        rows,
        occ,
        order,
        t["bag"],
        t["weights"],
        t["cols"],
        t["dims"],
        t["B"],
        F32 if seg is None else seg[3],
        opt.packed(step),
    )


def update(t, grad_out, optimizer, lr=0.1, step=1, wd=0.0, wd_mode=0, seg=None):
    occ, order = occurrences(t)
    ops().embedding_update(
        *update_args(t, grad_out, occ, order, optimizer, lr, step, wd, wd_mode, seg)
    )


def key_grads(t, grad_out):
    """(U, max_dim) float64 reduced gradient of every distinct key."""
    B = t["B"]
    U = t["rows"].numel()
    g = torch.zeros(U, int(t["dims"].max()), dtype=torch.float64)
    for j in range(t["inverse"].numel()):
        f, i = divmod(int(t["bag"][j]), B)
        c, d = int(t["cols"][f]), int(t["dims"][f])
        w = 1.0 if t["weights"] is None else float(t["weights"][j])
        g[int(t["inverse"][j]), :d] += w * grad_out[i, c : c + d].double().cpu()
    return g


def key_dims(t):
    U = t["rows"].numel()
    dims = [0] * U
    for j in range(t["inverse"].numel()):
        f = int(t["bag"][j]) // t["B"]
        dims[int(t["inverse"][j])] = int(t["dims"][f])
    return dims


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
def test_pool_matches_the_weighted_sum_of_rows_in_the_feature_layout(device, weighted):
    t = batch(device, seed=1, weighted=weighted)
    out = pool(t)
    assert out.shape == (t["B"], t["width"])
    torch.testing.assert_close(out.double().cpu(), reference_pool(t), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_pool_of_a_sequence_batch_is_a_gather(device):
    """Pooling NONE: every occurrence its own bag, one feature of one dim."""
    t = batch(device, seed=2, dims=(8,), weighted=False)
    n = t["inverse"].numel()
    seg0, seg1, offsets = space(t)
    out = ops().embedding_pool(
        seg0,
        seg1,
        offsets,
        t["inverse"],
        torch.arange(n + 1, device=device),
        None,
        t["cols"],
        t["dims"],
        n,
        8,
        F32,
    )
    rows = t["rows"][t["inverse"]]
    want = t["values"][rows.clamp(min=0), :8] * (rows >= 0).unsqueeze(1)
    assert torch.equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_update_subtracts_the_reduced_gradient_at_each_keys_dim(device):
    t = batch(device, seed=3)
    before = t["values"].clone()
    grad_out = torch.randn(t["B"], t["width"], device=device)
    update(t, grad_out, SGD, lr=0.5)
    g = key_grads(t, grad_out)
    want = before.double().cpu()
    for u, d in enumerate(key_dims(t)):
        r = int(t["rows"][u])
        if r >= 0:
            want[r, :d] -= 0.5 * g[u, :d]
    torch.testing.assert_close(t["values"].double().cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_rowwise_adagrad_update_uses_the_mean_square_of_the_whole_row(device):
    t = batch(device, seed=4, dims=(40, 40), width=48)  # a row longer than a warp
    before = t["values"].clone().double().cpu()
    grad_out = torch.randn(t["B"], t["width"], device=device)
    update(t, grad_out, ROWWISE, lr=0.3)
    g = key_grads(t, grad_out)
    want = before.clone()
    for u, d in enumerate(key_dims(t)):
        r = int(t["rows"][u])
        if r < 0 or d == 0:
            continue
        s0 = before[r, d] + (g[u, :d] ** 2).mean()
        want[r, d] = s0
        want[r, :d] -= 0.3 / (s0.sqrt() + 1e-8) * g[u, :d]
    torch.testing.assert_close(t["values"].double().cpu(), want, rtol=1e-5, atol=1e-5)


def hot_batch(device, dim=40, n=3000):
    """One feature, n bags of one occurrence; key 0 takes most of them (a hot
    key, summed chunk by chunk on the GPU), the rest spread over 30 keys."""
    g = torch.Generator().manual_seed(11)
    inverse = torch.where(
        torch.rand(n, generator=g) < 0.7, 0, torch.randint(1, 31, (n,), generator=g)
    )
    t = dict(
        values=torch.randn(64, 3 * dim, generator=g),
        rows=torch.randperm(64, generator=g)[:31],
        inverse=inverse,
        offsets=torch.arange(n + 1),
        weights=torch.rand(n, generator=g),
        cols=torch.zeros(1, dtype=torch.int64),
        dims=torch.tensor([dim]),
        B=n,
        width=dim,
        bag=torch.arange(n),
    )
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_update_of_a_hot_key_sums_all_its_occurrences(device):
    t = hot_batch(device)
    before = t["values"].clone()
    grad_out = torch.randn(t["B"], t["width"], device=device)
    update(t, grad_out, SGD, lr=0.01)
    g = key_grads(t, grad_out)
    want = before.double().cpu()
    for u in range(t["rows"].numel()):
        want[int(t["rows"][u]), :40] -= 0.01 * g[u, :40]
    torch.testing.assert_close(t["values"].double().cpu(), want, rtol=1e-4, atol=1e-4)


BATCHES = {
    # mixed dims (one longer than a warp's 32 lanes), a few occurrences per key
    "mixed": (lambda device: batch(device, seed=5, dims=(16, 48, 16), width=160), 1e-5),
    # one hot key (summed chunk by chunk on the GPU)
    "hot": (hot_batch, 1e-4),
    # more bags and keys (80,000 and about 60,000) than a GPU's grid-strided
    # launches have warps: their loops take several items per warp
    "large": (
        lambda device: batch(device, seed=6, dims=(8, 16), B=40_000, num_rows=70_000, width=48),
        1e-5,
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(BATCHES))
def test_cuda_pool_matches_the_cpu_kernel(kind):
    make, tol = BATCHES[kind]
    cpu, gpu = make("cpu"), make("cuda")
    torch.testing.assert_close(pool(gpu).cpu(), pool(cpu), rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(BATCHES))
@pytest.mark.parametrize("optim", [SGD, ADAM, ADAGRAD, ROWWISE, FTRL], ids=lambda o: o.name)
def test_cuda_update_matches_the_cpu_kernel(kind, optim):
    make, tol = BATCHES[kind]
    cpu, gpu = make("cpu"), make("cuda")
    for t in (cpu, gpu):  # optimizer state (accumulators) is never negative
        t["values"].abs_()
    grad = torch.randn(cpu["B"], cpu["width"])
    for step in (1, 2):
        update(cpu, grad, optim, step=step)
        update(gpu, grad.cuda(), optim, step=step)
    torch.testing.assert_close(gpu["values"].cpu(), cpu["values"], rtol=tol, atol=tol)


def _with_fill_rows(t, num_fill=3):
    """Keys 1 and 2 read fill rows 2 and 0 (rows -4 and -2); also returns the
    same batch with the fill rows appended to the values instead."""
    g = torch.Generator().manual_seed(11)
    fill = torch.randn(num_fill, t["width"] - 1, generator=g).to(t["values"].device)
    t = dict(t, rows=t["rows"].clone())
    t["rows"][1], t["rows"][2] = -4, -2
    wide = torch.zeros(fill.shape[0], t["values"].shape[1], device=fill.device)
    wide[:, : fill.shape[1]] = fill
    flat = dict(t, values=torch.cat([t["values"], wide]), rows=t["rows"].clone())
    n = t["values"].shape[0]
    flat["rows"][1], flat["rows"][2] = n + 2, n + 0
    return t, fill, flat


def _seg_with_fill_refs(t):
    """space(t), keeping the fill rows' negative refs."""
    seg0, seg1, offsets = space(t)
    return seg0, seg1, torch.where(t["rows"] < -1, t["rows"], offsets)


def _pool_with_fill(t, fill):
    return pool(t, (*_seg_with_fill_refs(t), F32), fill)


@pytest.mark.parametrize("device", DEVICES)
def test_pool_reads_fill_rows_through_negative_rows(device):
    t, fill, flat = _with_fill_rows(batch(device, seed=12, dims=(4, 8, 4)))
    out = _pool_with_fill(t, fill)
    torch.testing.assert_close(out.double().cpu(), reference_pool(flat), rtol=1e-5, atol=1e-5)


def test_pool_refuses_fill_rows_it_does_not_have_naming_them():
    t, fill, _ = _with_fill_rows(batch("cpu", seed=14), num_fill=2)
    with pytest.raises(ValueError, match="row -4 at index 1 reads fill row 2 .* fill has 2 rows"):
        _pool_with_fill(t, fill)
    with pytest.raises(ValueError, match="fill has 0 rows"):
        _pool_with_fill(t, None)


@pytest.mark.parametrize("device", DEVICES)
def test_update_leaves_keys_of_fill_rows_alone(device):
    t, _, _ = _with_fill_rows(batch(device, seed=13))
    grad = torch.ones(t["B"], t["width"], device=device)
    plain = dict(t, values=t["values"].clone(), rows=t["rows"].clamp(min=-1))
    before = t["values"].clone()
    update(t, grad, SGD, lr=1.0, seg=(*_seg_with_fill_refs(t), F32))
    update(plain, grad, SGD, lr=1.0)
    assert torch.equal(t["values"], plain["values"])
    assert not torch.equal(t["values"], before)


def test_pool_refuses_a_row_out_of_range_naming_it():
    t = batch("cpu", seed=6)
    t["rows"][1] = 1000
    with pytest.raises(ValueError, match=r"row offset 96000 at index 1 does not hold"):
        pool(t)
    seg0, seg1, offsets = space(t)
    offsets[1] = 6  # not a multiple of 4
    with pytest.raises(ValueError, match="row offset 6 at index 1"):
        pool(t, (seg0, seg1, offsets, F32))


def test_update_refuses_bad_occurrences_and_changes_nothing():
    t = batch("cpu", seed=7)
    before = t["values"].clone()
    occ, order = occurrences(t)
    occ[-1] += 1
    grad = torch.randn(t["B"], t["width"])
    with pytest.raises(ValueError, match="occ_offsets must run from 0 to"):
        ops().embedding_update(*update_args(t, grad, occ, order))
    assert torch.equal(t["values"], before)


@pytest.mark.parametrize("device", DEVICES)
def test_pool_tiled_writes_every_column_and_untiled_zeros_columns_of_no_feature(device):
    """``tiled``: the output is not zeroed first, and every column is still
    written (bags of no occurrence included); without it a column of no
    feature reads zeros."""
    t = batch(device, seed=5)
    zeroed = pool(t)
    for _ in range(3):  # memory a tiled output may reuse holds NaN, not zeros
        dirty = torch.full((t["B"], t["width"]), float("nan"), device=device)
        del dirty
        tiled = ops().embedding_pool(*pool_args(t), tiled=True)
        assert torch.equal(tiled, zeroed)
    wide = ops().embedding_pool(*pool_args(t, out_width=t["width"] + 3))
    assert torch.equal(wide[:, : t["width"]], zeroed)
    assert (wide[:, t["width"] :] == 0).all()


def test_pool_refuses_a_feature_that_does_not_fit_the_output():
    t = batch("cpu", seed=8)
    with pytest.raises(ValueError, match="feature 2"):
        ops().embedding_pool(*pool_args(t, out_width=t["width"] - 1))


OPCHECK_UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)


@pytest.mark.parametrize("device", DEVICES)
def test_pooling_ops_opcheck(device):
    t = batch(device, seed=9)
    torch.library.opcheck(
        ops().embedding_pool.default,
        pool_args(t),
        test_utils=OPCHECK_UTILS,
    )
    occ, order = occurrences(t)
    grad = torch.randn(t["B"], t["width"], device=device)
    torch.library.opcheck(
        ops().embedding_update.default,
        update_args(t, grad, occ, order),
        test_utils=("test_schema", "test_faketensor"),
    )


# -------------------------------------------------------------- row spaces --


def typed_rows(values: torch.Tensor, dtype, state_dim: int) -> torch.Tensor:
    """Rows of (num_rows, width) float32 values in the storage layout: the
    first ``width - state_dim`` columns as ``dtype`` (padded to 4 bytes), the
    last ``state_dim`` as float32 state. (num_rows, row_bytes) uint8."""
    dim = values.shape[1] - state_dim
    emb = values[:, :dim].to(dtype).contiguous().view(torch.uint8)
    pad = (-emb.shape[1]) % 4
    parts = [emb, torch.zeros(values.shape[0], pad, dtype=torch.uint8, device=values.device)]
    parts.append(values[:, dim:].contiguous().view(torch.uint8))
    return torch.cat(parts, dim=1).contiguous()


def split_space(rows_bytes: torch.Tensor, rows: torch.Tensor, cut: int, etype: int):
    """The rows split after row ``cut`` into two segments, and the byte
    offsets of ``rows`` in that space."""
    rb = rows_bytes.shape[1]
    seg0, seg1 = rows_bytes[:cut].reshape(-1), rows_bytes[cut:].reshape(-1)
    return seg0, seg1, torch.where(rows >= 0, rows * rb, -1), etype


def from_typed(rows_bytes: torch.Tensor, dim: int, dtype, state_dim: int) -> torch.Tensor:
    """typed_rows back to float32 (num_rows, dim + state_dim)."""
    esize = torch.tensor([], dtype=dtype).element_size()
    emb = rows_bytes[:, : dim * esize].contiguous().view(dtype).float()
    off = -(-dim * esize // 4) * 4
    state = rows_bytes[:, off : off + 4 * state_dim].contiguous().view(torch.float32)
    return torch.cat([emb, state], dim=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [6, 19])  # 19: the CPU's eight-at-a-time loops and a tail
def test_pool_reads_typed_rows_across_two_segments(device, dtype, dim):
    t = batch(device, seed=12, dims=(dim, dim, dim), width=dim, num_rows=40)
    rows = typed_rows(t["values"], dtype, 0)
    out = pool(t, split_space(rows, t["rows"], 17, element_type(dtype)))
    # The reference pools the stored (rounded) embeddings.
    t["values"] = t["values"].to(dtype).float()
    torch.testing.assert_close(out.double().cpu(), reference_pool(t), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_adam_update_of_typed_rows_keeps_float32_state_and_rounds_the_weight(device, dtype):
    dim = 5  # 10 or 5 * 2 bytes: the state starts after padding to 4 bytes
    t = batch(device, seed=13, dims=(dim, dim), width=3 * dim, num_rows=30)
    t["values"][:, dim:].abs_()  # second moments are never negative
    rows = typed_rows(t["values"], dtype, 2 * dim)
    ref = dict(t, values=from_typed(rows, dim, dtype, 2 * dim))  # what is stored
    seg = split_space(rows, t["rows"], 11, element_type(dtype))
    grad = torch.randn(t["B"], 2 * dim, device=device)
    update(t, grad, ADAM, lr=0.05, seg=seg)
    update(ref, grad, ADAM, lr=0.05)  # float32 rows, the same arithmetic
    got = from_typed(torch.cat([seg[0], seg[1]]).view(30, -1), dim, dtype, 2 * dim)
    # The state is float32 and exact; the weight is the float32 result rounded.
    torch.testing.assert_close(got[:, dim:], ref["values"][:, dim:], rtol=0, atol=0)
    want_w = ref["values"][:, :dim].to(dtype).float()
    torch.testing.assert_close(got[:, :dim], want_w, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_update_across_two_segments_equals_one_segment(device):
    t = batch(device, seed=14, dims=(4, 8, 4), width=24)
    t["values"].abs_()  # row-wise Adagrad's accumulator is never negative
    one = dict(t, values=t["values"].clone())
    rows = typed_rows(t["values"], torch.float32, 0)
    seg = split_space(rows, t["rows"], 23, F32)
    grad = torch.randn(t["B"], t["width"], device=device)
    update(one, grad, ROWWISE, lr=0.2)
    update(t, grad, ROWWISE, lr=0.2, seg=seg)
    got = torch.cat([seg[0], seg[1]]).view(rows.shape).view(torch.float32)
    assert torch.equal(got, one["values"])


# ------------------------------------------------------- occurrence_bags --


def bags_reference(offsets, feature_tables, batch):
    """The bag and table of each occurrence, with repeat_interleave."""
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return bag, feature_tables[bag // batch]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_occurrence_bags_match_repeat_interleave(device, seed):
    g = torch.Generator().manual_seed(seed)
    num_features, batch = 3, 5 + seed
    # Empty bags included, and a first offset past 0 (a batch's slice).
    lengths = torch.randint(0, 4, (num_features * batch,), generator=g)
    lengths[: seed + 1] = 0
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]) + 7 * seed
    feature_tables = torch.tensor([2, 0, 2])
    n = int(lengths.sum())
    want_bag, want_tables = bags_reference(offsets, feature_tables, batch)
    bag, tables = ops().occurrence_bags(
        offsets.to(device), feature_tables.to(device), n, batch, False
    )
    assert bag.cpu().tolist() == want_bag.tolist()
    assert tables.cpu().tolist() == want_tables.tolist()
    seq, tables = ops().occurrence_bags(
        offsets.to(device), feature_tables.to(device), n, batch, True
    )
    assert seq.cpu().tolist() == list(range(n + 1))
    assert tables.cpu().tolist() == want_tables.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_occurrence_bags_of_an_empty_batch(device):
    offsets = torch.zeros(7, dtype=torch.int64, device=device)
    bag, tables = ops().occurrence_bags(offsets, torch.tensor([0, 1], device=device), 0, 3, False)
    assert bag.numel() == 0 and tables.numel() == 0
    seq, _ = ops().occurrence_bags(offsets, torch.tensor([0, 1], device=device), 0, 3, True)
    assert seq.cpu().tolist() == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_occurrence_bags_past_the_offsets_end_name_the_last_bag(device):
    """Occurrences after the last bag's end (offsets are not read on the
    host) are given the last bag, one that exists."""
    offsets = torch.tensor([0, 1, 2], device=device)
    bag, tables = ops().occurrence_bags(offsets, torch.tensor([4], device=device), 4, 2, False)
    assert bag.cpu().tolist() == [0, 1, 1, 1]
    assert tables.cpu().tolist() == [4, 4, 4, 4]


def test_occurrence_bags_bad_input():
    ft = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"offsets has 6 entries, not num_features \(2\) \* batch"):
        ops().occurrence_bags(torch.zeros(6, dtype=torch.int64), ft, 0, 3, False)
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        ops().occurrence_bags(torch.zeros(1, dtype=torch.int64), ft, 0, 0, False)
    with pytest.raises(ValueError, match="num_indices must not be negative, got -1"):
        ops().occurrence_bags(torch.zeros(7, dtype=torch.int64), ft, -1, 3, False)
    with pytest.raises(ValueError, match="2 occurrences but no bag"):
        ops().occurrence_bags(torch.zeros(1, dtype=torch.int64), ft[:0], 2, 3, False)
    with pytest.raises(TypeError, match="offsets must be Long"):
        ops().occurrence_bags(torch.zeros(7, dtype=torch.int32), ft, 0, 3, False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sequence", [False, True])
def test_occurrence_bags_opcheck(device, sequence):
    """The op's schema, its fake kernel against the real one, and tracing."""
    offsets = torch.tensor([0, 2, 2, 3, 6, 6, 7], device=device)
    torch.library.opcheck(
        ops().occurrence_bags.default,
        (offsets, torch.tensor([1, 0], device=device), 7, 3, sequence),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )

"""The pooling ops (embedding_pool, embedding_update) against plain torch.

The references are written out with index_add_ and the optimizer's equations;
CUDA cases compare the CUDA kernels with the CPU ones on the same inputs.
"""

import pytest
import torch

from dynamicemb import DynamicEmbOptimType
from dynamicemb.embedding import RowOptimizer
from dynamicemb.table._native import ops
from tests.devices import DEVICES

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType

SGD, ADAM, ADAGRAD, ROWWISE = (
    EmbOptimType.EXACT_SGD,
    EmbOptimType.ADAM,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
)
FTRL = DynamicEmbOptimType.FTRL


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


def pool(t):
    return ops().embedding_pool(
        t["values"],
        t["rows"],
        t["inverse"],
        t["offsets"],
        t["weights"],
        t["cols"],
        t["dims"],
        t["B"],
        t["width"],
    )


def occurrences(t):
    order = torch.argsort(t["inverse"], stable=True)
    counts = torch.bincount(t["inverse"], minlength=t["rows"].numel())
    occ = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
    occ[1:] = torch.cumsum(counts, 0)
    return occ, order


def update(t, grad_out, optimizer, lr=0.1, step=1, wd=0.0, wd_mode=0):
    occ, order = occurrences(t)
    opt = RowOptimizer(optimizer, learning_rate=lr, weight_decay=wd, weight_decay_mode=wd_mode)
    ops().embedding_update(
        t["values"],
        grad_out,
        t["rows"],
        occ,
        order,
        t["bag"],
        t["weights"],
        t["cols"],
        t["dims"],
        t["B"],
        opt.packed(step),
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
    out = ops().embedding_pool(
        t["values"],
        t["rows"],
        t["inverse"],
        torch.arange(n + 1, device=device),
        None,
        t["cols"],
        t["dims"],
        n,
        8,
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
}


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


def test_pool_refuses_a_row_out_of_range_naming_it():
    t = batch("cpu", seed=6)
    t["rows"][1] = 1000
    with pytest.raises(ValueError, match="row 1000 at index 1"):
        pool(t)


def test_update_refuses_bad_occurrences_and_changes_nothing():
    t = batch("cpu", seed=7)
    before = t["values"].clone()
    occ, order = occurrences(t)
    occ[-1] += 1
    grad = torch.randn(t["B"], t["width"])
    with pytest.raises(ValueError, match="occ_offsets must run from 0 to"):
        ops().embedding_update(
            t["values"],
            grad,
            t["rows"],
            occ,
            order,
            t["bag"],
            t["weights"],
            t["cols"],
            t["dims"],
            t["B"],
            RowOptimizer(SGD, learning_rate=0.1).packed(1),
        )
    assert torch.equal(t["values"], before)


def test_pool_refuses_a_feature_that_does_not_fit_the_output():
    t = batch("cpu", seed=8)
    with pytest.raises(ValueError, match="feature 2"):
        ops().embedding_pool(
            t["values"],
            t["rows"],
            t["inverse"],
            t["offsets"],
            t["weights"],
            t["cols"],
            t["dims"],
            t["B"],
            t["width"] - 1,
        )


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
        (
            t["values"],
            t["rows"],
            t["inverse"],
            t["offsets"],
            t["weights"],
            t["cols"],
            t["dims"],
            t["B"],
            t["width"],
        ),
        test_utils=OPCHECK_UTILS,
    )
    occ, order = occurrences(t)
    grad = torch.randn(t["B"], t["width"], device=device)
    torch.library.opcheck(
        ops().embedding_update.default,
        (
            t["values"],
            grad,
            t["rows"],
            occ,
            order,
            t["bag"],
            t["weights"],
            t["cols"],
            t["dims"],
            t["B"],
            RowOptimizer(SGD, learning_rate=0.1).packed(1),
        ),
        test_utils=("test_schema", "test_faketensor"),
    )

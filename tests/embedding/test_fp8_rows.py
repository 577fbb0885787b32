"""FP8 rows through the row ops: element type FLOAT8_E4M3FN, e4m3fn codes
with a power-of-two scale per row (cc/storage/row_space.h, "FP8 rows").

The references are independent of the kernels: rows are encoded and decoded
with torch's float8_e4m3fn and a scale computed here; pooling is float64
math over the decoded rows; an update is the same optimizer applied to the
decoded rows in float32 (test_pooling_ops' kernels on float32 rows), whose
result the FP8 row must hold within one e4m3fn step, at the scale of its
largest magnitude. Stochastic rounding is checked by its mean: SGD steps of a
tenth of a code's step move the mean of many rows by their sum. CUDA cases
compare the CUDA kernels with the CPU ones, byte for byte.
"""

import pytest
import torch

from dynamicemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, DynamicEmbOptimType
from dynamicemb.embedding.initializer import init_rows, init_rows_at, initializer_op_args
from dynamicemb.table import constants, ops
from tests.devices import DEVICES
from tests.embedding import test_pooling_ops as po
from tests.embedding.fp8_reference import fp8_values, pad4, scale_of

FP8 = int(constants()["ElementType"]["FLOAT8_E4M3FN"])
RMSPROP_AR = DynamicEmbOptimType.ROWWISE_RMSPROP_AR


def fp8_rows(values: torch.Tensor, state_dim: int) -> torch.Tensor:
    """(n, dim + state_dim) float32 as FP8 rows, (n, row_bytes) uint8:
    the codes (torch's rounding to nearest), padding, the scale, the state."""
    dim = values.shape[1] - state_dim
    emb = values[:, :dim]
    scale = scale_of(emb.abs().amax(dim=1))
    codes = (emb / scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    n, dev = values.shape[0], values.device
    parts = [codes, torch.zeros(n, pad4(dim) - dim, dtype=torch.uint8, device=dev)]
    parts += [scale[:, None].contiguous().view(torch.uint8)]
    parts += [values[:, dim:].contiguous().view(torch.uint8)]
    return torch.cat(parts, dim=1).contiguous()


def decode(rows: torch.Tensor, dim: int, state_dim: int) -> torch.Tensor:
    """fp8_rows back to float32 (n, dim + state_dim): the rows' values."""
    p = pad4(dim)
    state = rows[:, p + 4 : p + 4 + 4 * state_dim].contiguous().view(torch.float32)
    return torch.cat([fp8_values(rows, dim), state], dim=1)


def scales(rows: torch.Tensor, dim: int) -> torch.Tensor:
    p = pad4(dim)
    return rows[:, p : p + 4].contiguous().view(torch.float32).reshape(-1)


def step_of(y: torch.Tensor) -> torch.Tensor:
    """One e4m3fn step at y (values of a row divided by its scale)."""
    a = y.double().abs()
    binade = torch.floor(torch.log2(a.clamp(min=2.0**-6)))
    return torch.where(a < 2.0**-6, torch.full_like(a, 2.0**-9), torch.exp2(binade - 3))


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_rows_pool_as_the_sum_of_their_decoded_values(device):
    t = po.batch(device, seed=21, dims=(6, 6, 6), width=6, num_rows=40)
    t["values"] = t["values"] * 0.05
    rows = fp8_rows(t["values"], 0)
    out = po.pool(t, po.split_space(rows, t["rows"], 17, FP8))
    t["values"] = decode(rows, 6, 0)
    torch.testing.assert_close(out.double().cpu(), po.reference_pool(t), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optim", [po.SGD, po.ADAM, po.ROWWISE, RMSPROP_AR], ids=lambda o: o.name)
def test_an_fp8_update_holds_the_float32_update_within_a_step(device, optim):
    dim = 5
    # The row-wise optimizers reserve 16 bytes.
    sd = {po.SGD: 0, po.ADAM: 2 * dim, po.ROWWISE: 4, RMSPROP_AR: 4}[optim]
    t = po.batch(device, seed=22, dims=(dim, dim), width=dim + sd, num_rows=30)
    t["values"][:, :dim] *= 0.05
    t["values"][:, dim:].abs_()  # second moments and accumulators are never negative
    rows = fp8_rows(t["values"], sd)
    ref = dict(t, values=decode(rows, dim, sd))  # what the FP8 rows hold
    before = ref["values"].clone()
    seg = po.split_space(rows, t["rows"], 11, FP8)
    grad = torch.randn(t["B"], 2 * dim, device=device)
    po.update(t, grad, optim, lr=0.05, step=3, seg=seg)
    po.update(ref, grad, optim, lr=0.05, step=3)  # float32 rows, the same arithmetic
    after = torch.cat([seg[0], seg[1]]).view(30, -1)
    got = decode(after, dim, sd)
    want = ref["values"]
    # The state is float32, as for every row type: the reference's. On the GPU
    # a row-wise optimizer sums the row's squared gradient across a warp's
    # lanes, and an FP8 row gives each lane four consecutive values where a
    # float32 row of this dim (not a multiple of 4) gives it every 32nd: the
    # sum's order, and so its last bit, may differ there; elsewhere exactly.
    rowwise_gpu = device != "cpu" and optim in (po.ROWWISE, RMSPROP_AR)
    rtol = 2.0**-22 if rowwise_gpu else 0.0
    torch.testing.assert_close(got[:, dim:], want[:, dim:], rtol=rtol, atol=0)
    # An updated row's scale follows its new largest magnitude and each
    # value is one of the two codes around the float32 result; the other
    # rows are as they were.
    updated = torch.unique(t["rows"][t["rows"] >= 0]).cpu()
    kept = torch.ones(30, dtype=torch.bool)
    kept[updated] = False
    assert torch.equal(got[kept, :dim], before[kept, :dim])
    s = scales(after, dim)[updated]
    w = want[updated, :dim]
    assert torch.equal(s, scale_of(w.abs().amax(dim=1)))
    err = (got[updated, :dim] - w).abs().double()
    bound = step_of(w / s[:, None]) * s[:, None].double()
    assert bool((err < bound).all()), float((err - bound).max())
    assert bool((got[updated, :dim] != before[updated, :dim]).any())


@pytest.mark.parametrize("device", DEVICES)
def test_steps_smaller_than_half_a_code_accumulate_on_average(device):
    """4,000 rows [1, .75, .75, .75] (scale 2^-8: a code step of 2^-4 at
    .75), 40 SGD steps of a tenth of a code: the mean reaches .5, where
    rounding to nearest would stay at .75."""
    keys, dim, steps = 4000, 4, 40
    code_step = 2.0**-4
    values = torch.tensor([[1.0, 0.75, 0.75, 0.75]]).repeat(keys, 1)
    rows = fp8_rows(values, 0).to(device)
    t = dict(
        rows=torch.arange(keys, device=device),
        inverse=torch.arange(keys, device=device),
        offsets=torch.arange(keys + 1, device=device),
        weights=None,
        cols=torch.zeros(1, dtype=torch.int64, device=device),
        dims=torch.tensor([dim], device=device),
        B=keys,
        width=dim,
        bag=torch.arange(keys, device=device),
    )
    grad = torch.tensor([[0.0, 1.0, 1.0, 1.0]], device=device).repeat(keys, 1)
    seg = (rows.reshape(-1), rows.new_empty(0), torch.arange(keys, device=device) * 8, FP8)
    for s in range(1, steps + 1):
        po.update(t, grad, po.SGD, lr=code_step / 10, step=s, seg=seg)
    got = decode(rows.cpu(), dim, 0)
    assert torch.equal(got[:, 0], torch.ones(keys))
    mean = got[:, 1:].double().mean()
    sigma = code_step * (steps / 4 / (3 * keys)) ** 0.5
    assert abs(float(mean) - (0.75 - steps * code_step / 10)) < 6 * sigma, float(mean)


@pytest.mark.parametrize("device", DEVICES)
def test_new_fp8_rows_are_the_initializers_rows_within_a_step(device):
    dim, sd, n = 19, 3, 50
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.02)
    keys = torch.arange(1000, 1000 + n, device=device)
    tids = torch.full_like(keys, 2)
    rb = pad4(dim) + 4 + 4 * sd
    space = (
        torch.full((n * rb,), 7, dtype=torch.uint8, device=device),
        torch.empty(0, device=device),
    )
    offsets = torch.arange(n, device=device) * rb
    init_rows_at(space, offsets, keys, tids, dim, initializer_op_args(args), 5, FP8, sd, (1, 0.5))
    rows = space[0].view(n, rb).cpu()
    want = init_rows(keys, dim, args, tids, 5).cpu()
    got = decode(rows, dim, sd)
    s = scales(rows, dim)
    assert torch.equal(s, scale_of(want.abs().amax(dim=1)))
    err = (got[:, :dim] - want).abs().double()
    assert bool((err < step_of(want / s[:, None]) * s[:, None].double()).all())
    assert torch.equal(rows[:, dim : pad4(dim)], torch.zeros(n, pad4(dim) - dim, dtype=torch.uint8))
    assert torch.equal(got[:, dim:], torch.tensor([[0.0, 0.5, 0.5]]).repeat(n, 1))
    again = (torch.zeros(n * rb, dtype=torch.uint8, device=device), space[1])
    init_rows_at(again, offsets, keys, tids, dim, initializer_op_args(args), 5, FP8, sd, (1, 0.5))
    assert torch.equal(again[0].cpu(), space[0].cpu())  # the same draws


def test_an_fp8_row_wider_than_the_kernels_take_is_refused():
    dim = 513
    space = (torch.zeros(pad4(dim) + 4, dtype=torch.uint8), torch.empty(0))
    args = initializer_op_args(DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT))
    zero = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="an FP8 row has at most 512 elements, got dim 513"):
        init_rows_at(space, zero, zero, zero, dim, args, 0, FP8, 0)
    t = po.batch("cpu", seed=23, dims=(dim,), width=dim, num_rows=4)
    with pytest.raises(ValueError, match="at most 512 elements"):
        po.pool(t, po.split_space(fp8_rows(t["values"], 0), t["rows"], 2, FP8))


def test_fp8_fill_rows_are_bytes_of_the_rows_layout():
    t = po.batch("cpu", seed=24, dims=(4,), width=4, num_rows=10, weighted=False)
    rows = fp8_rows(t["values"], 0)
    t["rows"][1] = -2  # reads fill row 0
    fill = fp8_rows(torch.tensor([[0.5, -0.25, 0.125, 1.0]]), 0)
    seg = po.split_space(rows, t["rows"], 4, FP8)
    seg = (seg[0], seg[1], torch.where(t["rows"] == -2, -2, seg[2]), FP8)  # keep the fill ref
    out = po.pool(t, seg, fill=fill)
    ref = dict(t, values=torch.cat([decode(rows, 4, 0), decode(fill, 4, 0)]))
    ref["rows"] = torch.where(t["rows"] == -2, rows.shape[0], t["rows"])
    torch.testing.assert_close(out.double(), po.reference_pool(ref), rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="fill must be .*Byte"):
        po.pool(t, seg, fill=fill.float())


# --------------------------------------------------------------- CUDA --


@pytest.mark.gpu
@pytest.mark.parametrize("optim", [po.SGD, po.ADAM, po.ROWWISE], ids=lambda o: o.name)
# A few keys, and about 30,000 (as many as pooling_ops' "large" float32 batch).
@pytest.mark.parametrize("samples,num_rows", [(5, 30), (20_000, 40_000)], ids=["few", "many"])
# More than a warp's lanes in one chunk of 128; three chunks, the last one
# partial (a warp keeps the later chunks' new values apart until the scale).
@pytest.mark.parametrize("dim", [40, 300])
def test_cuda_fp8_kernels_write_the_cpu_kernels_codes(optim, samples, num_rows, dim):
    """The same rows, gradient and keys: the same scales and codes, but where
    the float32 results differ in their last bits (the GPU sums and fuses
    differently) and a stochastic rounding falls between them: one step."""
    sd = {po.SGD: 0, po.ADAM: 2 * dim, po.ROWWISE: 4}[optim]
    out = {}
    for device in ("cpu", "cuda"):
        t = po.batch(device, seed=25, dims=(dim, dim), B=samples, width=dim + sd, num_rows=num_rows)
        t["values"][:, :dim] *= 0.05
        t["values"][:, dim:].abs_()
        rows = fp8_rows(t["values"].cpu(), sd).to(device)
        seg = po.split_space(rows, t["rows"], 11, FP8)
        pooled = po.pool(t, seg)
        grad = torch.randn(t["B"], 2 * dim, generator=torch.Generator().manual_seed(3)).to(device)
        po.update(t, grad, optim, lr=0.05, step=7, seg=seg)
        out[device] = (pooled.cpu(), torch.cat([seg[0], seg[1]]).cpu().view(num_rows, -1))
    torch.testing.assert_close(out["cuda"][0], out["cpu"][0], rtol=1e-5, atol=1e-6)
    gpu, cpu = (decode(out[d][1], dim, sd) for d in ("cuda", "cpu"))
    torch.testing.assert_close(gpu[:, dim:], cpu[:, dim:], rtol=1e-5, atol=1e-6)
    s = scales(out["cpu"][1], dim)
    assert torch.equal(scales(out["cuda"][1], dim), s)
    codes_differ = out["cuda"][1][:, :dim] != out["cpu"][1][:, :dim]
    assert float(codes_differ.float().mean()) < 0.01
    err = (gpu[:, :dim] - cpu[:, :dim]).abs().double()
    assert bool((err <= step_of(cpu[:, :dim] / s[:, None]) * s[:, None].double() * 1.001).all())


@pytest.mark.gpu
def test_cuda_new_fp8_rows_are_the_cpu_ones():
    dim, sd, n = 70, 2, 33
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.1, upper=0.1)
    rb = pad4(dim) + 4 + 4 * sd
    got = {}
    for device in ("cpu", "cuda"):
        keys = torch.arange(n, device=device) * 977
        space = (
            torch.zeros(n * rb, dtype=torch.uint8, device=device),
            torch.empty(0, device=device),
        )
        offsets = torch.arange(n, device=device) * rb
        init_rows_at(space, offsets, keys, keys * 0, dim, initializer_op_args(args), 9, FP8, sd)
        got[device] = space[0].cpu()
    assert torch.equal(got["cuda"], got["cpu"])


@pytest.mark.parametrize("device", DEVICES)
def test_an_fp8_row_given_its_key_and_step_is_rounded_alike_at_any_place(device):
    """embedding_update's ``rounding`` (each distinct key, then the step)
    seeds the rounding: the same rows stored at other places (a cache, a
    staging buffer) get the same bytes; without it the place seeds it and
    they differ. A ``rounding`` of another length is refused naming it."""
    dim = 8
    t = po.batch(device, seed=31, dims=(dim, dim), width=dim, num_rows=30)
    t["values"] *= 0.05
    rows = fp8_rows(t["values"], 0)
    moved = torch.randperm(30, generator=torch.Generator().manual_seed(1)).to(device)
    t2 = dict(t, rows=torch.where(t["rows"] >= 0, moved[t["rows"].clamp(min=0)], -1))
    rows2 = torch.empty_like(rows)
    rows2[moved] = rows
    grad = torch.randn(t["B"], 2 * dim, device=device)
    occ, order = po.occurrences(t)
    keys = torch.arange(t["rows"].numel(), device=device) * 7919 + (1 << 40)
    rounding = torch.cat([keys, keys.new_full((1,), 9)])
    got = {}
    for given in (rounding, None):
        for name, tt, rr in (("here", t, rows), ("moved", t2, rows2)):
            seg = po.split_space(rr.clone(), tt["rows"], 11, FP8)
            args = po.update_args(tt, grad, occ, order, po.SGD, 0.3, 9, seg=seg)
            ops().embedding_update(*args, None, given)
            got[name] = torch.cat([seg[0], seg[1]]).view(30, -1)
        here, there = got["here"], got["moved"][moved]
        updated = torch.unique(t["rows"][t["rows"] >= 0])
        assert torch.equal(here, there) == (given is not None)
        assert not torch.equal(here[updated], rows[updated])
    seg = po.split_space(rows.clone(), t["rows"], 11, FP8)
    with pytest.raises(ValueError, match="rounding"):
        ops().embedding_update(*po.update_args(t, grad, occ, order, seg=seg), None, keys)
    assert torch.equal(torch.cat([seg[0], seg[1]]).view(30, -1), rows)

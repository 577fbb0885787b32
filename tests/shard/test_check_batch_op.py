"""The check_batch op (cc/routing/batch_check.h): the value checks of a sharded
batch and its lengths per feature, against a plain PyTorch reference of the
documented rule, on the CPU and (on a GPU) CUDA against the CPU."""

import bisect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamicemb.table import first_valid_key, ops
from tests.devices import DEVICES

OFFSETS_START, NEGATIVE_LENGTH, LENGTHS_SUM, RESERVED_KEY, BAD_WEIGHT, BAD_ID = 8, 9, 10, 11, 12, 15
NONE, FINITE, COUNTERS = 0, 1, 2


CANONICAL_NAN = 0x7FF8000000000000  # every NaN weight's bits in a verdict


def double_bits(x: float) -> int:
    return torch.tensor([x], dtype=torch.float64).view(torch.int64).item()


def reference(values, lengths, weights, offsets, mask, num_features, stride, rule, rows=None):
    """The documented verdict row and lengths per feature, in Python."""
    v = values.tolist()
    ln = lengths.tolist()
    w = None if weights is None else weights.double().tolist()
    per_feature = [sum(ln[f * stride : (f + 1) * stride]) for f in range(num_features)]
    n = len(v)
    ends, end = [], 0
    for x in ln:
        end += max(x, 0)
        ends.append(end)

    def feature_of_bag(i):
        return min(bisect.bisect_right(ends, i), len(ln) - 1) // stride

    def checked(i):
        if mask is None or not ln:
            return True
        return bool(mask[feature_of_bag(i)])

    def out_of_rows(i):
        if rows is None or not ln:
            return False
        r = int(rows[feature_of_bag(i)])
        return r > 0 and not 0 <= v[i] < r

    def feature(i):
        end = 0
        for f, x in enumerate(per_feature):
            end += x
            if i < end:
                return f
        return max(num_features - 1, 0)

    def bad_weight(x):
        if rule == FINITE:
            return not math.isfinite(x)
        return not (math.isfinite(x) and x >= 0 and x == math.floor(x))

    row = [0, 0, 0, 0]
    negative = [i for i, x in enumerate(ln) if x < 0]
    reserved = [
        i
        for i in range(n)
        if values.dtype == torch.int64 and v[i] < first_valid_key() and checked(i)
    ]
    bad = [i for i in range(n) if w is not None and rule and bad_weight(w[i]) and checked(i)]
    bad_ids = [i for i in range(n) if out_of_rows(i)]
    if offsets is not None and int(offsets[0]) != 0:
        row = [OFFSETS_START, int(offsets[0]), 0, 0]
    elif negative:
        row = [NEGATIVE_LENGTH, negative[0], ln[negative[0]], 0]
    elif sum(ln) != n:
        row = [LENGTHS_SUM, sum(ln), n, 0]
    elif reserved:
        row = [RESERVED_KEY, reserved[0], v[reserved[0]], feature(reserved[0])]
    elif bad_ids:
        row = [BAD_ID, bad_ids[0], v[bad_ids[0]], feature(bad_ids[0])]
    elif bad:
        x = w[bad[0]]
        bits = CANONICAL_NAN if math.isnan(x) else double_bits(x)
        row = [BAD_WEIGHT, bad[0], bits, feature(bad[0])]
    return row + per_feature


def check(batch, device="cpu"):
    values, lengths, weights, offsets, mask, nf, stride, rule, *rows = batch

    def on(t):
        return None if t is None else t.to(device)

    out = ops().check_batch(
        on(values),
        on(lengths),
        on(weights),
        on(offsets),
        on(mask),
        nf,
        stride,
        rule,
        *[on(r) for r in rows],
    )
    assert out.dtype == torch.int64 and out.device.type == torch.device(device).type
    return out.tolist()


@st.composite
def batches(draw, max_bags=12):
    """Batches with a few faults each: negative lengths, sums off, reserved
    keys, bad weights, offsets that do not start at 0, ids outside a bounded
    feature's rows; int32 and int64 values and lengths; float16 to float64
    weights; masks of the checked features; rows bounding features."""
    nf = draw(st.integers(0, 4))
    stride = draw(st.integers(0 if nf == 0 else 1, max_bags // max(nf, 1)))
    lengths = draw(st.lists(st.integers(0, 3), min_size=nf * stride, max_size=nf * stride))
    n = sum(lengths)
    if lengths and draw(st.booleans()):
        lengths[draw(st.integers(0, len(lengths) - 1))] = draw(st.integers(-3, -1))
    if draw(st.integers(0, 4)) == 0:
        n += draw(st.integers(-2, 2))
    n = max(n, 0)
    fvk = first_valid_key()
    keys = st.one_of(st.integers(-5, 10**6), st.sampled_from([fvk - 1, fvk, -(2**63), fvk - 4]))
    values_list = draw(st.lists(keys, min_size=n, max_size=n))
    int32 = draw(st.booleans())
    if int32:
        values = torch.tensor(
            [max(min(x, 2**31 - 1), -(2**31)) for x in values_list], dtype=torch.int32
        )
    else:
        values = torch.tensor(values_list, dtype=torch.int64)
    lengths = torch.tensor(lengths, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    rule = draw(st.sampled_from([NONE, FINITE, COUNTERS]))
    weights = None
    if draw(st.booleans()):
        dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
        special = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.5, 2.0, 0.0])
        w = draw(st.lists(st.one_of(st.integers(0, 9).map(float), special), min_size=n, max_size=n))
        weights = torch.tensor(w, dtype=dtype)
    offsets = None
    if draw(st.booleans()):
        start = draw(st.sampled_from([0, 0, 1, -2]))
        offsets = torch.tensor(
            [start, start + 1], dtype=draw(st.sampled_from([torch.int32, torch.int64]))
        )
    mask = None
    if nf and draw(st.booleans()):
        mask = torch.tensor(draw(st.lists(st.booleans(), min_size=nf, max_size=nf)))
    rows = None
    if draw(st.booleans()):
        bounds = st.sampled_from([0, 1, 8, 10**6, 2**40])
        rows = torch.tensor(draw(st.lists(bounds, min_size=nf, max_size=nf)), dtype=torch.int64)
    return values, lengths, weights, offsets, mask, nf, stride, rule, rows


@settings(max_examples=300, deadline=None)
@given(batches())
def test_check_batch_follows_the_documented_rule(batch):
    assert check(batch) == reference(*batch)


def test_each_finding_and_its_priority():
    fvk = first_valid_key()
    v = torch.tensor([5, fvk - 1, 7, 9], dtype=torch.int64)
    w = torch.tensor([1.0, 2.0, 0.5, 1.0])
    good = torch.tensor([1, 1, 2])  # one feature of stride 3
    args = (None, 1, 3, COUNTERS)
    # The reserved key at 1 comes before the bad counter at 2.
    assert check((v, good, w, None, *args)) == [RESERVED_KEY, 1, fvk - 1, 0, 4]
    v_ok = v.clone()
    v_ok[1] = 3
    bits = torch.tensor([0.5], dtype=torch.float64).view(torch.int64).item()
    assert check((v_ok, good, w, None, *args)) == [BAD_WEIGHT, 2, bits, 0, 4]
    # Pooling weights may be fractional.
    assert check((v_ok, good, w, None, None, 1, 3, FINITE)) == [0, 0, 0, 0, 4]
    assert check((v, torch.tensor([1, 1, 1]), w, None, *args))[:4] == [LENGTHS_SUM, 3, 4, 0]
    assert check((v, torch.tensor([3, -1, 2]), w, None, *args))[:4] == [NEGATIVE_LENGTH, 1, -1, 0]
    offsets = torch.tensor([2, 3, 4, 6])
    assert check((v, torch.tensor([3, -1, 2]), w, offsets, *args))[:4] == [OFFSETS_START, 2, 0, 0]
    # Two features of stride 1: a reserved key of an unchecked feature passes,
    # a checked feature's is named with its feature.
    two = torch.tensor([2, 2])
    assert check((v, two, None, None, torch.tensor([False, True]), 2, 1, NONE)) == [
        0,
        0,
        0,
        0,
        2,
        2,
    ]
    v2 = torch.tensor([5, 6, fvk - 2, 8], dtype=torch.int64)
    want = [RESERVED_KEY, 2, fvk - 2, 1, 2, 2]
    assert check((v2, two, None, None, torch.tensor([False, True]), 2, 1, NONE)) == want
    # A static table's feature (rows 6): its ids lie in [0, 6); -1 and 6 are
    # named with their feature, in int32 values too; a dynamic feature's
    # (rows 0) are not bounded.
    mask = torch.tensor([False, True])
    for dtype in (torch.int64, torch.int32):
        for bad in (-1, 6):
            v3 = torch.tensor([5, bad, 9, -7], dtype=dtype)
            got = check((v3, two, None, None, mask, 2, 1, NONE, torch.tensor([6, 0])))
            assert got == [BAD_ID, 1, bad, 0, 2, 2], (dtype, bad)
        v3 = torch.tensor([5, 0, 9, -7], dtype=dtype)
        assert check((v3, two, None, None, mask, 2, 1, NONE, torch.tensor([6, 0])))[:4] == [0] * 4
    # The reserved key of a dynamic feature comes before an id out of rows.
    v4 = torch.tensor([7, 0, fvk - 1, 8], dtype=torch.int64)
    got = check((v4, two, None, None, mask, 2, 1, NONE, torch.tensor([6, 0])))
    assert got[:4] == [RESERVED_KEY, 2, fvk - 1, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_check_batch_opcheck(device):
    """The op's schema, its fake kernel against the real one, and tracing:
    with weights, offsets and a feature mask, and with none of them."""
    values = torch.tensor([4, 9, 1, 7], device=device)
    lengths = torch.tensor([1, 2, 0, 1], device=device)
    weights = torch.tensor([1.0, 2.0, 0.5, 3.0], device=device)
    offsets = torch.tensor([0, 1, 3, 3, 4], device=device)
    mask = torch.tensor([True, False], device=device)
    for args in (
        (values, lengths, weights, offsets, mask, 2, 2, FINITE),
        (values, lengths, None, None, None, 2, 2, NONE),
    ):
        torch.library.opcheck(ops().check_batch.default, args)


def test_bad_arguments_are_refused_naming_them():
    v = torch.tensor([1, 2], dtype=torch.int64)
    with pytest.raises(ValueError, match="3 lengths for 2 features of stride 1"):
        ops().check_batch(v, torch.tensor([1, 1, 0]), None, None, None, 2, 1, NONE)
    with pytest.raises(ValueError, match="weight_rule 3"):
        ops().check_batch(v, torch.tensor([1, 1]), None, None, None, 2, 1, 3)
    with pytest.raises(TypeError, match="values must be int32 or int64"):
        ops().check_batch(v.float(), torch.tensor([1, 1]), None, None, None, 2, 1, NONE)
    with pytest.raises(ValueError, match="feature_mask has 1 entries for 2 features"):
        ops().check_batch(v, torch.tensor([1, 1]), None, None, torch.tensor([True]), 2, 1, NONE)
    with pytest.raises(ValueError, match="feature_rows has 1 entries for 2 features"):
        ops().check_batch(v, torch.tensor([1, 1]), None, None, None, 2, 1, NONE, torch.tensor([4]))
    with pytest.raises(TypeError, match="feature_rows must be"):
        rows = torch.tensor([4, 4], dtype=torch.int32)
        ops().check_batch(v, torch.tensor([1, 1]), None, None, None, 2, 1, NONE, rows)
    with pytest.raises(TypeError, match="weights of float16, bfloat16, float32 or float64"):
        w8 = torch.zeros(2, dtype=torch.float8_e4m3fn)
        ops().check_batch(v, torch.tensor([1, 1]), w8, None, None, 2, 1, FINITE)


@st.composite
def large_batches(draw):
    """Batches past one warp and one block per feature: strides that are
    and are not multiples of 32, faults far from the start."""
    nf = draw(st.integers(1, 5))
    stride = draw(st.sampled_from([1, 31, 32, 33, 1000, 4099]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    lengths = torch.randint(0, 4, (nf * stride,), generator=g)
    n = int(lengths.sum())
    values = torch.randint(0, 10**9, (n,), generator=g, dtype=torch.int64)
    weights = torch.randint(0, 5, (n,), generator=g).float()
    if n and draw(st.booleans()):
        values[int(torch.randint(0, n, (1,), generator=g))] = first_valid_key() - 1
    if n and draw(st.booleans()):
        weights[int(torch.randint(0, n, (1,), generator=g))] = draw(
            st.sampled_from([math.nan, 0.25])
        )
    if draw(st.integers(0, 3)) == 0:
        lengths[int(torch.randint(0, lengths.numel(), (1,), generator=g))] = -1
    mask = None
    if draw(st.booleans()):
        mask = torch.rand(nf, generator=g) < 0.5
    rows = None
    if draw(st.booleans()):
        rows = torch.where(torch.rand(nf, generator=g) < 0.5, 10**9, 0).to(torch.int64)
        if n and draw(st.booleans()):
            values[int(torch.randint(0, n, (1,), generator=g))] = draw(st.sampled_from([-1, 10**9]))
    rule = draw(st.sampled_from([NONE, FINITE, COUNTERS]))
    int32 = draw(st.booleans())
    return (
        values,
        lengths.int() if int32 else lengths,
        weights,
        None,
        mask,
        nf,
        stride,
        rule,
        rows,
    )


@settings(max_examples=25, deadline=None)
@given(large_batches())
def test_check_batch_on_large_batches(batch):
    assert check(batch) == reference(*batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_a_nan_weight_is_named_by_the_canonical_nan_on_every_device(device, dtype):
    """NaNs of any sign and payload (their conversions to float64 differ
    between the CPU and CUDA) give one verdict: the canonical quiet NaN."""
    bits = {torch.float16: 0xFE01, torch.float32: 0x7FFFFFFF, torch.float64: -1}[dtype]
    int_type = {torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
    nan = torch.tensor([bits], dtype=torch.int64).to(int_type[dtype]).view(dtype)
    assert torch.isnan(nan).all()
    weights = torch.cat([torch.ones(2, dtype=dtype), nan])
    batch = (torch.tensor([4, 5, 6]), torch.tensor([1, 2]), weights, None, None, 1, 2, FINITE)
    assert check(batch, device) == [BAD_WEIGHT, 2, CANONICAL_NAN, 0, 3]


@pytest.mark.gpu
@settings(max_examples=200, deadline=None)
@given(st.one_of(batches(), large_batches()))
def test_cuda_check_batch_equals_the_cpu_one(batch):
    assert check(batch, "cuda") == check(batch, "cpu")


@pytest.mark.gpu
def test_cuda_check_batch_reads_nothing_on_the_host():
    values = torch.randint(0, 10**6, (100_000,), device="cuda")
    lengths = torch.ones(100_000, dtype=torch.int64, device="cuda")
    mask = torch.tensor([True, False], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = ops().check_batch(values, lengths, None, None, mask, 2, 50_000, NONE)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.tolist() == [0, 0, 0, 0, 50_000, 50_000]

"""Training tables with FP8 rows (``embedding_dtype=torch.float8_e4m3fn``):
every tier trains bit for bit as the all-device table does, every SGD step's
rows are exactly a dense reference's, training reduces a loss as float32
does, the memory the planner and ``memory_usage`` count is what the storage
allocates, and a bad dtype is refused naming it.

The references are independent of the kernels: rows are decoded with torch's
float8_e4m3fn and a power-of-two scale computed here (tests/embedding/
test_fp8_rows); the dense reference of an update is float32 SGD on the row as
stored, then the row's scale and stochastic rounding with the random bits of
(key, step, element) drawn by a Philox4x32-10 written here in numpy.
"""

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingConfig

from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb import DynamicEmbTableOptions
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.planner.prepare import dynamic_shard_storage, prepare_table_options
from dynamicemb.types import MemoryType
from tests.devices import DEVICES
from tests.embedding.fp8_reference import pad4, scale_of
from tests.storage.storage_cases import (
    assert_trains_like_device,
    table_options,
)

FP8 = torch.float8_e4m3fn
EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["hybrid", "cache", "cache_small", "external_cache"])
def test_fp8_tiers_train_like_the_all_device_module(mode, device):
    m, _, _ = assert_trains_like_device(
        mode, "adam", Pool.SUM, device, dims=(8, 5), steps=12, dtype=FP8
    )
    assert m.embedding_dtype == FP8


@pytest.mark.parametrize("dim", [3, 8, 13])
@pytest.mark.parametrize("optim", ["EXACT_SGD", "ADAM", "EXACT_ROWWISE_ADAGRAD"])
def test_an_fp8_row_is_its_codes_padded_its_scale_and_float32_state(dim, optim):
    opt = getattr(EmbOptimType, optim)
    state = {"EXACT_SGD": 0, "ADAM": 2 * dim, "EXACT_ROWWISE_ADAGRAD": 4}[optim]
    want = pad4(dim) + 4 + 4 * state
    assert value_row_bytes(opt, dim, FP8) == want
    m = BatchedDynamicEmbeddingTablesV2(
        [
            DynamicEmbTableOptions(
                dim=dim, max_capacity=256, bucket_capacity=128, embedding_dtype=FP8
            )
        ],
        optimizer=opt,
    )
    assert m.layout.row_bytes == [want]
    # Every row in the host tier (the default budget 0): 256 rows of it.
    assert m.storage.footprint().host == 256 * want
    assert m.rows.export_row_bytes(0, optim=False) == 8 * 2 + pad4(dim) + 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("caching", [False, True])
def test_the_planner_counts_the_bytes_an_fp8_table_allocates(device, caching):
    config = EmbeddingConfig(name="t", embedding_dim=8, num_embeddings=10_000)
    rb = value_row_bytes(EmbOptimType.ADAM, 8, FP8)  # 12 + 64
    given = DynamicEmbTableOptions(
        init_capacity=1000, embedding_dtype=FP8, caching=caching, global_hbm_for_values=600 * rb
    )
    options = prepare_table_options(given, config, world_size=2)
    m = BatchedDynamicEmbeddingTablesV2(
        [options], pooling_mode=Pool.SUM, optimizer=EmbOptimType.ADAM, device=torch.device(device)
    )
    # The dtype given as float32 (the config's) is overridden by the options'.
    plan = dynamic_shard_storage(options, torch.float32, EmbOptimType.ADAM, "cuda")
    f = m.storage.footprint()
    assert (plan.hbm, plan.ddr) == (f.device, f.host)
    fp32 = dynamic_shard_storage(
        prepare_table_options(
            DynamicEmbTableOptions(
                init_capacity=1000, caching=caching, global_hbm_for_values=600 * rb
            ),
            config,
            world_size=2,
        ),
        torch.float32,
        EmbOptimType.ADAM,
        "cuda",
    )
    assert plan.hbm + plan.ddr < fp32.hbm + fp32.ddr
    total = m.memory_usage(MemoryType.DEVICE) + m.memory_usage(MemoryType.HOST)
    assert total == f.device + f.host


def test_a_bad_embedding_dtype_is_refused_naming_it():
    with pytest.raises(ValueError, match="float8_e5m2"):
        DynamicEmbTableOptions(dim=8, embedding_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="int8"):
        DynamicEmbTableOptions(dim=8, embedding_dtype=torch.int8)
    with pytest.raises(ValueError, match="at most 512 .*dim 600"):
        DynamicEmbTableOptions(dim=600, embedding_dtype=FP8)
    with pytest.raises(ValueError, match="float64"):
        value_row_bytes(None, 8, torch.float64)


def _rows_of(m, keys, dim):
    found, e, _ = m.storage.read_rows(keys, torch.zeros_like(keys))
    assert bool(found.all())
    return e[:, :dim]


# ---------------------------------------------------------------------------
# The reference of an FP8 row's write: the scale of the new values' largest
# magnitude, then each value / scale rounded stochastically with 32 bits that
# Philox4x32-10 draws for (key, step, element / 4), one of the draw's four
# words, written here from the algorithm's definition (Salmon et al., SC'11)
# in numpy integers.
_M32 = np.uint64(0xFFFFFFFF)


def _philox(c0, c1, c2, c3, k0, k1):
    c = [np.asarray(x, dtype=np.uint64) & _M32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        n0 = (p1 >> np.uint64(32)) ^ c[1] ^ k0
        n2 = (p0 >> np.uint64(32)) ^ c[3] ^ k1
        c = [n0, p1 & _M32, n2, p0 & _M32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
    return np.stack(c, axis=-1)


def rounding_bits(key: int, step: int, dim: int) -> np.ndarray:
    """The 32 random bits of each element e of the row of ``key`` written at
    ``step``: word e % 4 of the draw of counter (e / 4, step, key) and key
    ("SRND", the step's high word)."""
    e = np.arange(dim, dtype=np.uint64)
    lo, hi = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    words = _philox(e // np.uint64(4), step & 0xFFFFFFFF, lo, hi, 0x53524E44, step >> 32)
    return words[np.arange(dim), (e % np.uint64(4)).astype(np.int64)]


def stochastic_fp8(x: torch.Tensor, bits: np.ndarray) -> torch.Tensor:
    """float32 values (each within e4m3fn's range) rounded to e4m3fn
    neighbours in float64 math: away from zero when the value's distance
    from the code toward zero, in 2^-20 of the code's step (normal codes),
    plus the bits' top 20 reaches a step; below 2^-6 (steps of 2^-9) when
    the bits are below the distance in 2^-32 of a step."""
    a = x.double().abs()
    r = torch.from_numpy(bits.astype(np.int64))
    normal = a >= 2.0**-6
    _, e = torch.frexp(a.clamp(min=2.0**-6))  # a in [2^(e-1), 2^e)
    step = torch.where(normal, torch.ldexp(torch.ones_like(a), e - 4), 2.0**-9)
    below = torch.floor(a / step) * step
    frac = (a - below) / step
    up = torch.where(normal, frac * 2**20 + (r >> 12) >= 2**20, r < frac * 2**32)
    return (torch.sign(x.double()) * (below + up * step)).float()


def fp8_write(values: torch.Tensor, key: int, step: int) -> torch.Tensor:
    """The values an FP8 row written with float32 ``values`` holds."""
    scale = scale_of(values.abs().amax())
    return stochastic_fp8(values / scale, rounding_bits(key, step, values.numel())) * scale


def test_stochastic_fp8_reference_is_unbiased_and_picks_neighbours():
    """The reference itself: codes either side, the mean the value (what
    cc/storage/row_space_test checks of the kernel's rounding)."""
    x = torch.tensor([1.01, -0.3, 0.0071, 447.5, 0.75])
    draws = torch.stack([stochastic_fp8(x, rounding_bits(7, s, 5)) for s in range(4000)])
    near = x.to(FP8).float()
    assert bool(((draws - x).abs() <= (x * 2**-3).abs().clamp(min=2**-9)).all())
    assert draws[:, 4].eq(0.75).all()  # a code stays
    assert all(set(draws[:, i].tolist()) >= {float(near[i])} for i in range(4))
    torch.testing.assert_close(draws.double().mean(0).float(), x, rtol=0.01, atol=2e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lr", [0.02, 0.001])
def test_fp8_sgd_rows_are_the_dense_update_rounded_with_the_kernels_bits(lr, device):
    """Every step's FP8 rows are exactly a dense reference's: the float32 SGD
    update (w - lr * g) of the row as it was, then the scale of the new
    largest magnitude and the stochastic rounding of each value with the
    bits of (key, step, element). Each key comes once per batch, so a key's
    gradient is its bag's output gradient. At lr 0.001 most updates are
    below half a code's step: rounding to nearest would keep them all. The
    output is the sum of the rows as stored (CUDA: the same math on the
    GPU's rows)."""
    dim, steps, bags, hot = 8, 12, 8, 2
    dev = torch.device(device)
    opts = table_options("device", (dim,), EmbOptimType.EXACT_SGD, dtype=FP8)
    m = BatchedDynamicEmbeddingTablesV2(
        opts, pooling_mode=Pool.SUM, optimizer=EmbOptimType.EXACT_SGD, learning_rate=lr, device=dev
    )
    g = torch.Generator().manual_seed(11)
    offsets = torch.arange(0, bags * hot + 1, hot)
    moved = 0
    for step in range(1, steps + 1):
        indices = torch.randperm(40, generator=g)[: bags * hot] * 1_000_000_007_000
        y = torch.randn(bags, dim, generator=g)
        out = m(indices.to(dev), offsets.to(dev))
        before = _rows_of(m, indices.to(dev), dim).cpu()  # inserted, not yet updated
        want = before.view(bags, hot, dim).sum(1)
        torch.testing.assert_close(out.detach().cpu(), want, rtol=1e-6, atol=1e-6)
        grad = out.detach().cpu() - y
        (0.5 * ((out - y.to(dev)) ** 2).sum()).backward()
        after = _rows_of(m, indices.to(dev), dim).cpu()
        lr32 = torch.tensor(lr, dtype=torch.float32)
        for i, k in enumerate(indices.tolist()):
            new = before[i] - lr32 * grad[i // hot]
            assert torch.equal(after[i], fp8_write(new, k, step)), (step, k)
        moved += int((after != before).sum())
    assert moved > 0


@pytest.mark.parametrize("dtype", [FP8, torch.float32])
def test_fp8_training_reduces_a_regression_loss_like_float32(dtype):
    """Each key learns a fixed target row by SGD: the loss falls to a small
    fraction of its start in FP8 as in float32 (FP8's floor is its rows'
    quantization, a few % of a value)."""
    dim, vocab, steps = 8, 64, 60
    targets = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(2)) * 0.1
    opts = table_options("device", (dim,), EmbOptimType.EXACT_SGD, dtype=dtype)
    m = BatchedDynamicEmbeddingTablesV2(
        opts, pooling_mode=Pool.SUM, optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.3
    )
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        keys = torch.randperm(vocab, generator=g)[:32]
        out = m(keys, torch.arange(33))
        loss = 0.5 * ((out - targets[keys]) ** 2).sum()
        loss.backward()
        losses.append(float(loss.detach()))
    first, last = sum(losses[:5]), sum(losses[-5:])
    assert last < 0.05 * first, (dtype, first, last)

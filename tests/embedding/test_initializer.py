"""init_rows: rows depend only on (seed, table, key, element), follow the
requested distribution, and agree between the CPU and CUDA backends."""

import pytest
import torch

from dynamicemb import DynamicEmbInitializerArgs
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb.embedding import init_rows
from dynamicemb.table import constants, ops
from tests.devices import DEVICES

ALL_MODES = [Mode.NORMAL, Mode.TRUNCATED_NORMAL, Mode.UNIFORM, Mode.CONSTANT, Mode.DEBUG]


def _args(mode, **kw):
    return DynamicEmbInitializerArgs(mode=mode, **kw)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_keys_row_does_not_depend_on_its_batch_or_position(mode):
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(-(2**62), 2**62, (500,), generator=g)
    tids = torch.randint(0, 3, (500,), generator=g)
    args = _args(mode, value=0.5)
    full = init_rows(keys, 16, args, tids, seed=7)
    perm = torch.randperm(500, generator=g)
    shuffled = init_rows(keys[perm], 16, args, tids[perm], seed=7)
    assert torch.equal(shuffled, full[perm])
    part = init_rows(keys[100:130], 16, args, tids[100:130], seed=7)
    assert torch.equal(part, full[100:130])


def test_seed_and_table_change_random_rows():
    keys = torch.arange(100)
    a = init_rows(keys, 8, _args(Mode.NORMAL), seed=1)
    assert not torch.equal(a, init_rows(keys, 8, _args(Mode.NORMAL), seed=2))
    assert not torch.equal(a, init_rows(keys, 8, _args(Mode.NORMAL), torch.ones_like(keys), seed=1))
    # Different keys get different rows.
    assert torch.unique(a, dim=0).shape[0] == 100


def test_uniform_fills_its_bounds_evenly():
    out = init_rows(torch.arange(20000), 32, _args(Mode.UNIFORM, lower=-0.25, upper=0.75))
    assert float(out.min()) >= -0.25 and float(out.max()) <= 0.75
    # mean 0.25, sd of the mean 0.289 / sqrt(640000)
    assert abs(float(out.double().mean()) - 0.25) < 0.003
    hist = torch.histc(out, bins=10, min=-0.25, max=0.75)
    assert float(hist.min()) > 0.97 * out.numel() / 10


def test_uniform_without_bounds_is_zero_to_one():
    out = init_rows(torch.arange(2000), 8, _args(Mode.UNIFORM))
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0 and float(out.mean()) > 0.45


def test_normal_has_the_requested_mean_and_std():
    out = init_rows(torch.arange(20000), 32, _args(Mode.NORMAL, mean=-1.0, std_dev=0.5)).double()
    assert abs(float(out.mean()) + 1.0) < 0.005
    assert abs(float(out.std()) - 0.5) < 0.005
    # standardised fourth moment of a normal is 3
    z = (out - out.mean()) / out.std()
    assert abs(float((z**4).mean()) - 3.0) < 0.05


def test_truncated_normal_stays_within_its_bounds():
    out = init_rows(
        torch.arange(5000), 16, _args(Mode.TRUNCATED_NORMAL, std_dev=1.0, lower=-0.5, upper=1.0)
    )
    assert float(out.min()) >= -0.5 and float(out.max()) <= 1.0
    # default bounds: +- 2 std_dev around the mean
    d = init_rows(torch.arange(5000), 16, _args(Mode.TRUNCATED_NORMAL, mean=3.0, std_dev=0.1))
    assert float(d.min()) >= 2.8 - 1e-6 and float(d.max()) <= 3.2 + 1e-6
    # the density falls off away from the mean, unlike a uniform
    inner = float(((d - 3.0).abs() < 0.1).double().mean())
    assert 0.6 < inner < 0.8  # P(|z| < 1 | |z| < 2) = 0.7165


def test_constant_and_debug_rows():
    c = init_rows(torch.tensor([1, 2]), 3, _args(Mode.CONSTANT, value=-2.5))
    assert torch.equal(c, torch.full((2, 3), -2.5))
    m = int(constants()["DEBUG_MODULUS"])
    keys = torch.tensor([5, m + 7, -1])
    d = init_rows(keys, 4, _args(Mode.DEBUG))
    assert d[:, 0].tolist() == [5.0, 7.0, float(m - 1)]
    assert torch.equal(d, d[:, :1].expand(3, 4))


def test_empty_batch_and_zero_dim():
    assert init_rows(torch.empty(0, dtype=torch.int64), 4, _args(Mode.NORMAL)).shape == (0, 4)
    assert init_rows(torch.arange(3), 0, _args(Mode.NORMAL)).shape == (3, 0)


def test_bad_arguments_raise_naming_the_value():
    keys = torch.arange(3)
    with pytest.raises(TypeError, match="Int"):
        init_rows(keys.int(), 4, _args(Mode.NORMAL))
    with pytest.raises(ValueError, match="3 vs 2"):
        init_rows(keys, 4, _args(Mode.NORMAL), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="mode 9"):
        ops().init_rows(keys, torch.zeros_like(keys), 4, 9, 0.0, 1.0, 0.0, 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="-1"):
        ops().init_rows(keys, torch.zeros_like(keys), -1, 0, 0.0, 1.0, 0.0, 1.0, 0.0, 0)
    with pytest.raises(TypeError, match="DynamicEmbInitializerArgs"):
        init_rows(keys, 4, "normal")


@pytest.mark.parametrize("device", DEVICES)
def test_init_rows_opcheck(device):
    keys = torch.tensor([3, 9, -4], device=device)
    torch.library.opcheck(
        ops().init_rows.default, (keys, torch.zeros_like(keys), 5, 0, 0.0, 1.0, 0.0, 1.0, 0.0, 3)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ALL_MODES)
def test_cuda_rows_equal_cpu_rows(mode):
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(-(2**62), 2**62, (4000,), generator=g)
    tids = torch.randint(0, 4, (4000,), generator=g)
    args = _args(mode, std_dev=0.3, value=1.5)
    cpu = init_rows(keys, 33, args, tids, seed=11)
    gpu = init_rows(keys.cuda(), 33, args, tids.cuda(), seed=11).cpu()
    if mode in (Mode.NORMAL, Mode.TRUNCATED_NORMAL):
        # log/sqrt/sin/cos may differ in the last bits between host and device.
        assert torch.allclose(gpu, cpu, rtol=0, atol=1e-6)
    else:
        assert torch.equal(gpu, cpu)


def test_truncated_normal_rows_of_a_planned_table_keep_the_documented_bounds():
    # The options' documentation: TRUNCATED_NORMAL's bounds default to
    # +-1/sqrt(N), N = num_embeddings; std_dev (1.0) is far wider, and the
    # rows are the normal density on that interval (nearly uniform), with no
    # mass piled up at the bounds.
    from torchrec.modules.embedding_configs import EmbeddingConfig

    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.planner import prepare_table_options

    config = EmbeddingConfig(name="t", num_embeddings=4096, embedding_dim=16, feature_names=["f"])
    options = DynamicEmbTableOptions(initializer_args=_args(Mode.TRUNCATED_NORMAL))
    args = prepare_table_options(options, config, 2).initializer_args
    rows = init_rows(torch.arange(20000), 16, args).double()
    bound = 1 / 64
    assert float(rows.abs().max()) <= bound
    assert float((rows.abs() >= bound * (1 - 1e-6)).double().mean()) < 1e-3
    quarters = torch.histc(rows, bins=4, min=-bound, max=bound) / rows.numel()
    assert torch.allclose(quarters, torch.full((4,), 0.25, dtype=torch.float64), atol=0.01)

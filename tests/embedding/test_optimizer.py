"""Fused row optimizers against the update rules written out in float64."""

import pytest
import torch

from dynamicemb import DynamicEmbOptimType
from dynamicemb.embedding import RowOptimizer
from dynamicemb.table import constants, ops
from tests.devices import DEVICES
from tests.embedding.optimizer_reference import reference_step

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType

DIM = 6


CASES = [
    ("sgd", lambda: RowOptimizer(EmbOptimType.EXACT_SGD, learning_rate=0.3)),
    (
        "sgd_l2",
        lambda: RowOptimizer(
            EmbOptimType.SGD, learning_rate=0.1, weight_decay=0.05, weight_decay_mode=1
        ),
    ),
    ("adam", lambda: RowOptimizer(EmbOptimType.ADAM, learning_rate=0.05, weight_decay=0.01)),
    (
        "adagrad",
        lambda: RowOptimizer(
            EmbOptimType.EXACT_ADAGRAD, learning_rate=0.2, weight_decay=0.02, weight_decay_mode=1
        ),
    ),
    ("rowwise", lambda: RowOptimizer(EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.2)),
    (
        "rowwise_l2",
        lambda: RowOptimizer(
            EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            learning_rate=0.2,
            weight_decay=0.1,
            weight_decay_mode=1,
        ),
    ),
    (
        "rowwise_decoupled",
        lambda: RowOptimizer(
            EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            learning_rate=0.2,
            weight_decay=0.1,
            weight_decay_mode=2,
        ),
    ),
    (
        "ftrl",
        lambda: RowOptimizer(
            DynamicEmbOptimType.FTRL, learning_rate=0.5, l1_reg=0.01, l2_reg=0.1, ftrl_beta=1.0
        ),
    ),
    (
        "ftrl_power",
        lambda: RowOptimizer(
            DynamicEmbOptimType.FTRL,
            learning_rate=0.5,
            learning_rate_power=-0.3,
            initial_accumulator_value=0.1,
        ),
    ),
    (
        "rmsprop_ar",
        lambda: RowOptimizer(
            DynamicEmbOptimType.ROWWISE_RMSPROP_AR, learning_rate=0.2, ar_alpha=0.5, ema_beta=0.9
        ),
    ),
    (
        "rmsprop_ar_floor_warmup",
        lambda: RowOptimizer(
            DynamicEmbOptimType.ROWWISE_RMSPROP_AR,
            learning_rate=0.3,
            ar_alpha=2.0,
            min_shrinkage=0.6,
            row_warmup_steps=4,
        ),
    ),
    (
        "ftrl_fixed_rate",
        lambda: RowOptimizer(
            DynamicEmbOptimType.FTRL, learning_rate=0.5, learning_rate_power=0.0, ftrl_beta=1.0
        ),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_ten_steps_match_the_float64_rules(device, name, make):
    opt = make()
    g = torch.Generator().manual_seed(len(name))
    sd = opt.state_dim(DIM)
    rows_total = 8
    values = torch.zeros(rows_total, DIM + sd)
    values[:, :DIM] = torch.randn(rows_total, DIM, generator=g) * 0.1
    opt.init_state(values[:, DIM:])
    ref = values.double().clone()
    values = values.to(device)
    for t in range(1, 11):
        rows = torch.randperm(rows_total, generator=g)[:5]
        grads = torch.randn(5, DIM, generator=g)
        opt.step(values, rows.to(device), grads.to(device), t)
        for r, gr in zip(rows.tolist(), grads.double()):
            w, s = reference_step(opt, ref[r, :DIM], ref[r, DIM:], gr, t)
            ref[r, :DIM] = w
            ref[r, DIM : DIM + s.numel()] = s
    got = values.cpu().double()
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6), (got - ref).abs().max()


def test_ftrl_l1_drives_weights_to_exactly_zero():
    opt = RowOptimizer(DynamicEmbOptimType.FTRL, learning_rate=0.1, l1_reg=10.0)
    values = torch.zeros(1, 3 * DIM)
    values[0, :DIM] = 0.5
    opt.step(values, torch.tensor([0]), torch.full((1, DIM), 0.01), 1)
    assert torch.equal(values[0, :DIM], torch.zeros(DIM))


def test_rows_minus_one_are_skipped_and_others_untouched():
    opt = RowOptimizer(EmbOptimType.EXACT_SGD, learning_rate=1.0)
    values = torch.ones(3, DIM)
    opt.step(values, torch.tensor([-1, 2]), torch.ones(2, DIM), 1)
    assert values[:2].eq(1).all() and values[2].eq(0).all()


def test_bad_arguments_raise_naming_the_value():
    with pytest.raises(ValueError, match="learning_rate must be positive, got 0"):
        RowOptimizer(DynamicEmbOptimType.FTRL, learning_rate=0.0)
    with pytest.raises(ValueError, match="learning_rate_power must be <= 0, got 0.5"):
        RowOptimizer(DynamicEmbOptimType.FTRL, learning_rate_power=0.5)
    with pytest.raises(ValueError, match="LAMB"):
        RowOptimizer(EmbOptimType.LAMB)
    opt = RowOptimizer(EmbOptimType.ADAM)
    with pytest.raises(ValueError, match="cannot hold dim 6"):
        opt.step(torch.zeros(2, DIM), torch.tensor([0]), torch.zeros(1, DIM), 1)
    with pytest.raises(ValueError, match="row 5 at index 0"):
        opt.step(torch.zeros(2, 3 * DIM), torch.tensor([5]), torch.zeros(1, DIM), 1)
    with pytest.raises(TypeError, match="float32"):
        opt.step(
            torch.zeros(2, 3 * DIM, dtype=torch.float64), torch.tensor([0]), torch.zeros(1, DIM), 1
        )


@pytest.mark.parametrize("device", DEVICES)
def test_optimizer_step_opcheck(device):
    values = torch.randn(4, 3 * DIM, device=device)
    optim = RowOptimizer(EmbOptimType.ADAM, learning_rate=0.1).packed(3)
    rows, grads = torch.tensor([2, 0], device=device), torch.randn(2, DIM, device=device)
    torch.library.opcheck(ops().optimizer_step.default, (values, rows, grads, optim))


def test_optimizer_step_refuses_a_malformed_optim_list_and_changes_nothing():
    values = torch.randn(4, 3 * DIM)
    before = values.clone()
    rows, grads = torch.tensor([0]), torch.randn(1, DIM)
    good = RowOptimizer(EmbOptimType.ADAM).packed(1)
    fields = constants()["OptimField"]
    with pytest.raises(ValueError, match=f"optim must hold {len(fields)} values"):
        ops().optimizer_step(values, rows, grads, good[:-1])
    for name, value, message in (
        ("STEP", 1.5, "step must be an integer, got 1.5"),
        ("TYPE", 9, "optimizer type 9 is not one of"),
        ("WEIGHT_DECAY_MODE", 3, "weight decay mode 3 is not"),
        ("STEP", 0, "step must be at least 1, got 0"),
    ):
        bad = list(good)
        bad[fields[name]] = value
        with pytest.raises(ValueError, match=message):
            ops().optimizer_step(values, rows, grads, bad)
    assert torch.equal(values, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("step", [1, 2, 3, 1000, 2**40])
def test_adam_bias_is_one_minus_beta_to_the_step(device, step):
    betas = torch.tensor([0.9, 0.999], device=device)
    got = ops().adam_bias(betas, step)
    assert torch.equal(got, 1.0 - torch.pow(betas, float(step)))
    torch.library.opcheck(ops().adam_bias.default, (betas, step))


def test_adam_bias_refuses_a_step_below_one():
    with pytest.raises(ValueError, match="step must be >= 1 .1-based., got 0"):
        ops().adam_bias(torch.tensor([0.9, 0.999]), 0)


# The optimizers the docs say dynamicemb tables implement (docs/training.md,
# "Embedding optimizers"), named by their enums' member names.
IMPLEMENTED = {
    "SGD",
    "EXACT_SGD",
    "ADAM",
    "EXACT_ADAGRAD",
    "EXACT_ROWWISE_ADAGRAD",
    "FTRL",
    "ROWWISE_RMSPROP_AR",
}
ALL_TYPES = list(EmbOptimType) + list(DynamicEmbOptimType)


@pytest.mark.parametrize("member", ALL_TYPES, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_every_optimizer_type_trains_or_is_refused_when_the_module_is_built(member):
    from dynamicemb import DynamicEmbPoolingMode, DynamicEmbTableOptions
    from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

    opts = [DynamicEmbTableOptions(dim=DIM, max_capacity=256)]
    keys, offsets = torch.tensor([5, 9]), torch.tensor([0, 2])
    if member.name not in IMPLEMENTED:
        with pytest.raises(ValueError) as info:
            BatchedDynamicEmbeddingTablesV2(
                opts, None, DynamicEmbPoolingMode.SUM, member, learning_rate=0.1
            )
        message = str(info.value)
        assert repr(member) in message
        for name in IMPLEMENTED:
            assert name in message, (name, message)
        return
    m = BatchedDynamicEmbeddingTablesV2(
        opts, None, DynamicEmbPoolingMode.SUM, member, learning_rate=0.1
    )
    first = m(keys, offsets)
    first.sum().backward()
    with torch.no_grad():
        second = m(keys, offsets)
    assert not torch.equal(first.detach(), second), "the step changed no row"

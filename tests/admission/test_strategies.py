"""Admission configuration: the provided strategies' checks, grouping,
admitters, the deprecated ``admission_counter`` and the planner's estimate."""

import dataclasses
import warnings

import pytest
import torch

from dynamicemb import (
    AdmissionStrategy,
    Counter,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
    MemoryType,
    MultiTableAdmitter,
    ProbabilisticAdmissionStrategy,
)
from dynamicemb.admission import (
    DEFAULT_KV_COUNTER,
    MultiTableFrequencyAdmitter,
    MultiTableKVCounter,
    MultiTableProbabilisticAdmitter,
)

CONST = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.5)


def test_top_level_names_are_the_admission_package_classes():
    import dynamicemb.admission as admission
    import dynamicemb.types as types

    assert FrequencyAdmissionStrategy is admission.FrequencyAdmissionStrategy
    assert ProbabilisticAdmissionStrategy is admission.ProbabilisticAdmissionStrategy
    for name in ("Counter", "KVCounter", "AdmissionStrategy", "MultiTableAdmitter"):
        assert getattr(types, name) is getattr(admission, name)
    assert issubclass(FrequencyAdmissionStrategy, AdmissionStrategy)
    assert issubclass(MultiTableKVCounter, Counter)
    assert issubclass(MultiTableFrequencyAdmitter, MultiTableAdmitter)


# ------------------------------------------------------------------ checks


@pytest.mark.parametrize(
    "kwargs, error, named",
    [
        ({"threshold": -1}, ValueError, "-1"),
        ({"threshold": 2.5}, TypeError, "2.5"),
        ({"threshold": True}, TypeError, "True"),
        ({"threshold": 2, "counter": 4096}, TypeError, "4096"),
        ({"threshold": 2, "counter": KVCounter(1000, bucket_capacity=100)}, ValueError, "100"),
        ({"threshold": 2, "initializer_args": "constant"}, TypeError, "'constant'"),
    ],
)
def test_frequency_strategy_rejects_bad_arguments_naming_them(kwargs, error, named):
    with pytest.raises(error, match=named):
        FrequencyAdmissionStrategy(**kwargs)


def test_frequency_strategy_rejects_a_counter_object_that_is_not_a_kv_counter():
    counter = MultiTableKVCounter([KVCounter(64, 16)])
    with pytest.raises(TypeError, match="MultiTableKVCounter"):
        FrequencyAdmissionStrategy(2, counter=counter)


@pytest.mark.parametrize(
    "p, error",
    [
        (0.0, ValueError),
        (-0.1, ValueError),
        (1.5, ValueError),
        (float("nan"), ValueError),
        ("0.5", TypeError),
        (True, TypeError),
    ],
)
def test_probabilistic_strategy_rejects_probabilities_outside_0_1(p, error):
    with pytest.raises(error, match=repr(p).strip("'") if p == p else "nan"):
        ProbabilisticAdmissionStrategy(p)


def test_probabilistic_strategy_accepts_one():
    assert ProbabilisticAdmissionStrategy(1).probability == 1.0


def test_default_counter_is_documented_constant():
    s = FrequencyAdmissionStrategy(3)
    assert s.counter is None and s.kv_counter == DEFAULT_KV_COUNTER
    assert DEFAULT_KV_COUNTER.capacity == 1 << 20


# ---------------------------------------------------------------- grouping


def test_equal_strategies_built_apart_group_together():
    a = FrequencyAdmissionStrategy(3, KVCounter(1 << 12), CONST)
    b = FrequencyAdmissionStrategy(
        3,
        KVCounter(1 << 16, bucket_capacity=128),  # capacities are per table
        DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=2.0),
    )
    assert a.get_grouped_key() == b.get_grouped_key()
    assert (
        DynamicEmbTableOptions(admit_strategy=a).get_grouped_key()
        == DynamicEmbTableOptions(admit_strategy=b).get_grouped_key()
    )


@pytest.mark.parametrize(
    "other",
    [
        FrequencyAdmissionStrategy(4),
        FrequencyAdmissionStrategy(3, KVCounter(1 << 12, key_type=torch.int32)),
        FrequencyAdmissionStrategy(3, initializer_args=CONST),
        ProbabilisticAdmissionStrategy(0.5),
    ],
)
def test_strategies_that_decide_differently_split(other):
    base = DynamicEmbTableOptions(admit_strategy=FrequencyAdmissionStrategy(3))
    assert base.get_grouped_key() != DynamicEmbTableOptions(admit_strategy=other).get_grouped_key()


def test_probabilistic_grouping():
    assert (
        ProbabilisticAdmissionStrategy(0.25).get_grouped_key()
        == ProbabilisticAdmissionStrategy(0.25).get_grouped_key()
    )
    assert (
        ProbabilisticAdmissionStrategy(0.25).get_grouped_key()
        != ProbabilisticAdmissionStrategy(0.5).get_grouped_key()
    )


# ---------------------------------------------------------------- admitters


def test_frequency_admitter_fuses_the_tables_counter_shares():
    strategies = [
        FrequencyAdmissionStrategy(2, KVCounter(100, bucket_capacity=32)),
        FrequencyAdmissionStrategy(2, KVCounter(256, bucket_capacity=64), None),
    ]
    admitter = FrequencyAdmissionStrategy.create_admitter(strategies, torch.device("cpu"))
    assert isinstance(admitter, MultiTableFrequencyAdmitter)
    counter = admitter.state()
    assert isinstance(counter, MultiTableKVCounter)
    # 100 slots in buckets of 32 are 4 whole buckets.
    assert [counter.table.capacity(t) for t in range(2)] == [128, 256]
    assert [counter.table.bucket_capacity(t) for t in range(2)] == [32, 64]
    assert admitter.threshold == 2
    assert admitter.non_admitted_initializer is None


def test_admitter_initializer_keeps_each_tables_parameters():
    other = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=-1.0)
    strategies = [
        ProbabilisticAdmissionStrategy(0.5, CONST),
        ProbabilisticAdmissionStrategy(0.5, other),
    ]
    admitter = ProbabilisticAdmissionStrategy.create_admitter(strategies, torch.device("cpu"))
    assert isinstance(admitter, MultiTableProbabilisticAdmitter)
    assert admitter.state() is None
    init = admitter.non_admitted_initializer
    rows = init(torch.tensor([5, 6]), torch.tensor([0, 1]), dims=[3, 2])
    assert rows.tolist() == [[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]]


@pytest.mark.parametrize(
    "strategies, error, named",
    [
        ([], ValueError, r"\[\]"),
        (
            [FrequencyAdmissionStrategy(2), ProbabilisticAdmissionStrategy(0.5)],
            TypeError,
            "table 1",
        ),
        (
            [FrequencyAdmissionStrategy(2), FrequencyAdmissionStrategy(3)],
            ValueError,
            "tables 0 and 1",
        ),
    ],
)
def test_create_admitter_refuses_tables_that_cannot_share_it(strategies, error, named):
    with pytest.raises(error, match=named):
        FrequencyAdmissionStrategy.create_admitter(strategies, torch.device("cpu"))


# ------------------------------------------------------- admission_counter


def test_admission_counter_warns_and_is_carried_to_a_copy_of_the_strategy():
    shared = FrequencyAdmissionStrategy(3)
    with pytest.warns(DeprecationWarning, match="carried to the admission strategy"):
        options = DynamicEmbTableOptions(
            admit_strategy=shared, admission_counter=KVCounter(4096, bucket_capacity=256)
        )
    assert options.admission_counter is None
    assert options.admit_strategy is not shared and shared.counter is None
    assert options.admit_strategy.counter == KVCounter(4096, bucket_capacity=256)
    assert options.admit_strategy.threshold == 3
    # Preparing the options again (dataclasses.replace) neither warns nor changes it.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = dataclasses.replace(options, dim=8)
    assert again.admit_strategy is options.admit_strategy


def test_admission_counter_equal_to_the_strategys_own_is_accepted():
    strategy = FrequencyAdmissionStrategy(3, KVCounter(4096))
    with pytest.warns(DeprecationWarning):
        options = DynamicEmbTableOptions(admit_strategy=strategy, admission_counter=KVCounter(4096))
    assert options.admit_strategy is strategy


def test_admission_counter_conflicting_with_the_strategys_counter_raises():
    strategy = FrequencyAdmissionStrategy(3, KVCounter(4096))
    with pytest.raises(ValueError, match="capacity=1024"):
        DynamicEmbTableOptions(admit_strategy=strategy, admission_counter=KVCounter(1024))


def test_admission_counter_that_is_not_a_kv_counter_raises_naming_it():
    counter = MultiTableKVCounter([KVCounter(64, 16)])
    with pytest.raises(TypeError, match="MultiTableKVCounter"):
        DynamicEmbTableOptions(
            admit_strategy=FrequencyAdmissionStrategy(3), admission_counter=counter
        )


@pytest.mark.parametrize("strategy", [None, ProbabilisticAdmissionStrategy(0.5)])
def test_admission_counter_without_a_counting_strategy_only_warns(strategy):
    with pytest.warns(DeprecationWarning, match="no effect"):
        options = DynamicEmbTableOptions(
            admit_strategy=strategy, admission_counter=KVCounter(64, 16)
        )
    assert options.admit_strategy is strategy
    assert options.admission_counter == KVCounter(64, 16)


# ------------------------------------------------------------ memory estimate


def test_planner_estimate_counts_the_counter_slots():
    torchrec = pytest.importorskip("torchrec")  # noqa: F841
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb.planner.prepare import dynamic_shard_storage

    base = DynamicEmbTableOptions(dim=8, init_capacity=1024, max_capacity=1024)
    with_counter = dataclasses.replace(
        base,
        admit_strategy=FrequencyAdmissionStrategy(2, KVCounter(1000, bucket_capacity=256)),
    )
    plain = dynamic_shard_storage(base, torch.float32, EmbOptimType.EXACT_SGD, "cuda")
    counted = dynamic_shard_storage(with_counter, torch.float32, EmbOptimType.EXACT_SGD, "cuda")
    # The estimate is what the counter allocates: 1000 slots are 4 buckets of
    # 256, 1024 slots of key, digest and count, and the table's layout rows.
    counter = MultiTableKVCounter([KVCounter(1000, bucket_capacity=256)])
    assert counted.hbm - plain.hbm == counter.memory_usage(MemoryType.HOST)
    info_bytes = sum(
        x.numel() * x.element_size() for x in (counter.table.info, counter.table.counters)
    )
    assert counter.memory_usage(MemoryType.HOST) - info_bytes == 1024 * (8 + 1 + 8)
    assert counted.ddr == plain.ddr
    cpu = dynamic_shard_storage(with_counter, torch.float32, EmbOptimType.EXACT_SGD, "cpu")
    assert cpu.hbm == 0 and cpu.ddr == counted.hbm + counted.ddr
    assert ProbabilisticAdmissionStrategy(0.5).state_bytes() == 0


# ------------------------------------------------------ probabilistic admitter


def _rate(admitter, n, k):
    keys = torch.arange(n)
    return admitter.admit(keys, torch.zeros_like(keys), torch.full((n,), k)).double().mean().item()


@pytest.mark.parametrize("k", [1, 3, 10])
def test_k_occurrences_are_k_tosses(k):
    n, p = 40000, 0.1
    admitter = MultiTableProbabilisticAdmitter(p, torch.device("cpu"), seed=5)
    want = 1 - (1 - p) ** k
    assert abs(_rate(admitter, n, k) - want) < 5 * (want * (1 - want) / n) ** 0.5


def test_without_frequencies_each_key_is_one_toss():
    n, p = 40000, 0.3
    admitter = MultiTableProbabilisticAdmitter(p, torch.device("cpu"), seed=9)
    keys = torch.arange(n)
    rate = admitter.admit(keys, torch.zeros_like(keys)).double().mean().item()
    assert abs(rate - p) < 5 * (p * (1 - p) / n) ** 0.5


def test_a_tiny_probability_is_not_lost_in_one_minus_p():
    # In float64 1 - 1e-17 == 1, so (1 - p) ** k would admit nothing; the
    # chance of 1e16 tosses is 1 - exp(-0.1).
    n, p, k = 20000, 1e-17, 10**16
    assert 1.0 - p == 1.0
    admitter = MultiTableProbabilisticAdmitter(p, torch.device("cpu"), seed=1)
    want = 1 - 2.718281828459045**-0.1
    assert abs(_rate(admitter, n, k) - want) < 5 * (want * (1 - want) / n) ** 0.5


def test_probability_one_admits_everything_and_seeds_repeat():
    assert _rate(MultiTableProbabilisticAdmitter(1.0, torch.device("cpu"), seed=0), 100, 1) == 1.0
    a = MultiTableProbabilisticAdmitter(0.5, torch.device("cpu"), seed=3)
    b = MultiTableProbabilisticAdmitter(0.5, torch.device("cpu"), seed=3)
    keys = torch.arange(500)
    assert torch.equal(a.admit(keys, keys), b.admit(keys, keys))

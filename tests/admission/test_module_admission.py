"""Admission in BatchedDynamicEmbeddingTablesV2: hand-computed sequences.

Tables use the DEBUG initializer (every element of a key's first row is the
key) and exact SGD with learning rate 1, and every output gets gradient 1, so
a stored key's row drops by its occurrences each step while a rejected key
reads its initial row again and again.
"""

import pytest
import torch

from dynamicemb import (
    AdmissionStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
    MemoryType,
    MultiTableAdmitter,
    ProbabilisticAdmissionStrategy,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage.stats import StatCol
from tests.devices import DEVICES

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType
DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)
ADMITTED, REJECTED = int(StatCol.ADMISSIONS), int(StatCol.REJECTIONS)


def _module(
    strategies, device="cpu", dim=2, pooling=DynamicEmbPoolingMode.NONE, capacity=256, **opt
):
    options = [
        DynamicEmbTableOptions(
            dim=dim, max_capacity=capacity, initializer_args=DEBUG, admit_strategy=s, **opt
        )
        for s in strategies
    ]
    return BatchedDynamicEmbeddingTablesV2(
        options, None, pooling, EmbOptimType.EXACT_SGD, device=device, learning_rate=1.0
    )


def _step(m, *features, train=True):
    """One sequence lookup: ``features[t]`` are table t's keys (one bag per
    key). Returns each key's first output column; trains with gradient 1."""
    keys = [torch.tensor(f, dtype=torch.int64) for f in features]
    # One bag per key; features side by side, padded to the same batch size.
    batch = max(len(k) for k in keys)
    lengths = torch.cat(
        [torch.cat([torch.ones(len(k)), torch.zeros(batch - len(k))]).long() for k in keys]
    )
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.cat(keys).to(m.device)
    if not train:
        m.eval()
        with torch.no_grad():
            out = m(indices, offsets.to(m.device))
        m.train()
        return out[:, 0].tolist()
    out = m(indices, offsets.to(m.device))
    out.backward(torch.ones_like(out))
    return out[:, 0].tolist()


def _admission(m):
    """(num_tables, 2): the missing keys admitted and rejected, per table."""
    return m.stats.counts[:, [ADMITTED, REJECTED]]


def _stored(m, keys, table=0):
    k = torch.tensor(keys, dtype=torch.int64, device=m.device)
    return (m.rows.hash_table.find(k, torch.full_like(k, table)) >= 0).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_a_key_once_per_step_enters_at_the_threshold(device):
    m = _module([FrequencyAdmissionStrategy(3, KVCounter(256, 16))], device)
    counter = m.admitter.state()
    assert _step(m, [7]) == [7.0] and _stored(m, [7]) == [False]
    assert counter.get(torch.tensor([7]), torch.tensor([0])).tolist() == [1]
    # Rejected: its gradient changed nothing.
    assert _step(m, [7]) == [7.0] and _stored(m, [7]) == [False]
    # The third sighting admits it: its first row, then trained.
    assert _step(m, [7]) == [7.0] and _stored(m, [7]) == [True]
    assert counter.get(torch.tensor([7]), torch.tensor([0])).tolist() == [0]
    assert int(counter.size()[0]) == 0
    assert _step(m, [7]) == [6.0]
    assert _admission(m)[0].tolist() == [1, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_occurrences_in_one_batch_count_together(device):
    m = _module([FrequencyAdmissionStrategy(3, KVCounter(256, 16))], device)
    # 9 three times: admitted at once; 5 twice: rejected (count 2).
    assert _step(m, [9, 5, 9, 5, 9]) == [9.0, 5.0, 9.0, 5.0, 9.0]
    assert _stored(m, [9, 5]) == [True, False]
    # 9 was trained by its three occurrences; 5 crosses the threshold now.
    assert _step(m, [9, 5]) == [6.0, 5.0]
    assert _stored(m, [5]) == [True]
    assert _step(m, [5]) == [4.0]
    assert _admission(m)[0].tolist() == [2, 1]


@pytest.mark.parametrize("threshold", [0, 1])
def test_thresholds_zero_and_one_admit_every_key_at_once(threshold):
    m = _module([FrequencyAdmissionStrategy(threshold, KVCounter(256, 16))])
    assert _step(m, [3, 4]) == [3.0, 4.0]
    assert _stored(m, [3, 4]) == [True, True]
    assert _step(m, [3, 4]) == [2.0, 3.0]
    assert int(m.admitter.state().size()[0]) == 0  # nothing waits in the counter
    assert _admission(m)[0].tolist() == [2, 0]


def test_rejected_rows_come_from_the_strategys_initializer_else_the_tables():
    const = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=-2.5)
    own = _module([FrequencyAdmissionStrategy(2, KVCounter(256, 16), const)])
    assert _step(own, [11]) == [-2.5]
    # Admitted, the key starts from the table's initializer.
    assert _step(own, [11]) == [11.0]
    table = _module([FrequencyAdmissionStrategy(2, KVCounter(256, 16))])
    assert _step(table, [11]) == [11.0]


def test_pooled_bags_mix_stored_and_rejected_rows():
    m = _module(
        [FrequencyAdmissionStrategy(2, KVCounter(256, 16))], pooling=DynamicEmbPoolingMode.SUM
    )
    # One bag: 20 twice (admitted), 30 once (rejected).
    out = m(torch.tensor([20, 30, 20]), torch.tensor([0, 3]))
    assert out[0].tolist() == [70.0, 70.0]
    out.backward(torch.ones_like(out))
    assert _stored(m, [20, 30]) == [True, False]
    out = m(torch.tensor([20, 30]), torch.tensor([0, 2]))
    # 20 lost 2 (two occurrences, gradient 1); 30 is admitted now, fresh.
    assert out[0].tolist() == [18.0 + 30.0] * 2


def test_eval_never_admits_nor_counts():
    m = _module([FrequencyAdmissionStrategy(2, KVCounter(256, 16))])
    counter = m.admitter.state()
    _step(m, [40])
    for _ in range(3):
        assert _step(m, [41, 40], train=False) == [0.0, 0.0]  # the eval initializer
    assert _stored(m, [40, 41]) == [False, False]
    assert counter.get(torch.tensor([40, 41]), torch.tensor([0, 0])).tolist() == [1, 0]
    assert _admission(m)[0].tolist() == [0, 1]


def test_fused_tables_count_their_keys_apart():
    strategies = [
        FrequencyAdmissionStrategy(2, KVCounter(128, 16)),
        FrequencyAdmissionStrategy(2, KVCounter(512, 32)),
    ]
    m = _module(strategies)
    counter = m.admitter.state()
    assert counter.num_tables == 2
    # Key 5 in both tables: counted per table.
    assert _step(m, [5], [5, 6]) == [5.0, 5.0, 6.0]
    assert _step(m, [5], [6]) == [5.0, 6.0]
    assert _stored(m, [5], 0) == [True] and _stored(m, [5, 6], 1) == [False, True]
    assert counter.get(torch.tensor([5, 5]), torch.tensor([0, 1])).tolist() == [0, 1]
    assert _admission(m).tolist() == [[1, 1], [1, 2]]


def test_tables_that_cannot_share_an_admitter_are_not_fused():
    with pytest.raises(ValueError, match="admit_strategy or none"):
        _module([FrequencyAdmissionStrategy(2), None])
    with pytest.raises(ValueError, match="one admission configuration"):
        _module([FrequencyAdmissionStrategy(2), FrequencyAdmissionStrategy(3)])


def test_memory_usage_includes_the_counter():
    plain = _module([None])
    counted = _module([FrequencyAdmissionStrategy(2, KVCounter(1024, 64))])
    counter = counted.admitter.state()
    assert counted.memory_usage(MemoryType.HOST) == plain.memory_usage(
        MemoryType.HOST
    ) + counter.memory_usage(MemoryType.HOST)
    assert counter.memory_usage(MemoryType.HOST) >= 1024 * (8 + 1 + 8)
    assert counted.memory_usage(MemoryType.DEVICE) == 0  # a CPU module
    with pytest.raises(ValueError, match="'device'"):
        counted.memory_usage("device")


class _OddKeys(AdmissionStrategy):
    """Admits odd keys; records what it was asked."""

    calls: list = []

    class _Admitter(MultiTableAdmitter):
        def admit(self, keys, table_ids, frequencies=None):
            _OddKeys.calls.append((keys.tolist(), frequencies.tolist()))
            return keys % 2 == 1

    @classmethod
    def create_admitter(cls, table_strategies, device):
        return cls._Admitter()


def test_a_custom_admitter_is_asked_about_missing_keys_only_with_their_occurrences():
    _OddKeys.calls = []
    m = _module([_OddKeys()])
    assert _step(m, [1, 2, 2, 3]) == [1.0, 2.0, 2.0, 3.0]
    assert _step(m, [1, 2, 3, 4]) == [0.0, 2.0, 2.0, 4.0]
    assert _OddKeys.calls == [([1, 2, 3], [1, 2, 1]), ([2, 4], [1, 1])]
    assert _admission(m)[0].tolist() == [2, 3]


class _Broken(AdmissionStrategy):
    @classmethod
    def create_admitter(cls, table_strategies, device):
        class A(MultiTableAdmitter):
            def admit(self, keys, table_ids, frequencies=None):
                return torch.ones(keys.numel() + 1, dtype=torch.bool)

        return A()


def test_an_admitter_answering_the_wrong_shape_is_refused_naming_it():
    m = _module([_Broken()])
    with pytest.raises(TypeError, match=r"shape \(2,\), got torch.bool \(3,\)"):
        _step(m, [1, 2])


@pytest.mark.parametrize("device", DEVICES)
def test_probabilistic_admission_rate_within_bounds(device):
    p, n = 0.2, 20000
    torch.manual_seed(123)
    m = _module([ProbabilisticAdmissionStrategy(p)], device, dim=1, capacity=1 << 16)
    keys = torch.arange(1, n + 1, device=device)
    m(keys, torch.arange(n + 1, device=device)).sum().backward()
    admitted = m.stats.counts[0, ADMITTED].item()
    assert admitted + m.stats.counts[0, REJECTED].item() == n
    # Binomial(n, p): 5 standard deviations.
    assert abs(admitted - p * n) < 5 * (n * p * (1 - p)) ** 0.5
    assert int(m.rows.hash_table.size()[0]) == admitted


def test_probabilistic_admission_repeats_after_manual_seed():
    def run():
        torch.manual_seed(7)
        m = _module([ProbabilisticAdmissionStrategy(0.5)])
        _step(m, list(range(1, 200)))
        return _stored(m, list(range(1, 200)))

    first = run()
    assert first == run()
    assert 0 < sum(first) < 199


@pytest.mark.gpu
def test_cuda_module_admits_as_the_cpu_module():
    """Frequency admission is deterministic: the same batches give the same
    outputs, admission counts and counter on both devices."""
    modules = {
        dev: _module(
            [
                FrequencyAdmissionStrategy(3, KVCounter(512, 32)),
                FrequencyAdmissionStrategy(3, KVCounter(256, 16)),
            ],
            dev,
            dim=4,
            pooling=DynamicEmbPoolingMode.SUM,
            capacity=1024,
        )
        for dev in ("cpu", "cuda")
    }
    g = torch.Generator().manual_seed(11)
    for _ in range(8):
        lengths = torch.randint(0, 5, (2 * 64,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        indices = torch.randint(0, 3000, (int(lengths.sum()),), generator=g)
        outs = {}
        for dev, m in modules.items():
            out = m(indices.to(dev), offsets.to(dev))
            out.backward(torch.ones_like(out))
            outs[dev] = out.detach().cpu()
        torch.testing.assert_close(outs["cuda"], outs["cpu"], rtol=1e-5, atol=1e-5)
    cpu, gpu = modules["cpu"], modules["cuda"]
    assert torch.equal(cpu.stats.counts, gpu.stats.counts.cpu())
    a, b = cpu.admitter.state().table, gpu.admitter.state().table
    for x, y in ((a.keys, b.keys), (a.scores, b.scores), (a.counters, b.counters)):
        assert torch.equal(x, y.cpu())


def test_metrics_report_the_admissions_and_the_counter_memory():
    """dynamicemb.metrics reads what the module counts: the keys admitted and
    rejected per table, and each table's memory with its counter share."""
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from dynamicemb.metrics import TABLE, instrument

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        m = _module([FrequencyAdmissionStrategy(2, KVCounter(256, 16))] * 2)
        instrument(m, collection="c", table_names=["a", "b"], meter_provider=provider)
        _step(m, [1, 2, 3], [4])
        _step(m, [1, 5], [4])  # 1 and 4 are admitted
        got = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for p in metric.data.data_points:
                        got.setdefault(metric.name, {})[p.attributes[TABLE]] = p.value
    finally:
        provider.shutdown()
    assert got["dynamicemb.table.admissions"] == {"a": 1, "b": 1}
    assert got["dynamicemb.table.rejections"] == {"a": 4, "b": 1}
    host = m.memory_per_table(MemoryType.HOST)
    share = m.admitter.state().memory_per_table(MemoryType.HOST)
    assert share == [256 * (8 + 1 + 8) + 2 * 8 * 8] * 2  # slots; info and counters rows
    plain = _module([None] * 2)
    assert [h - s for h, s in zip(host, share)] == plain.memory_per_table(MemoryType.HOST)


def test_keys_held_by_a_backing_tier_are_not_put_to_the_admitter():
    """With a device cache over a host table, a key that left the cache is
    still stored: it is found, not admitted again."""
    from dynamicemb.dynamicemb_config import value_row_bytes

    row_bytes = value_row_bytes(EmbOptimType.EXACT_SGD, 2, torch.float32)
    m = _module(
        [FrequencyAdmissionStrategy(2, KVCounter(256, 16))],
        caching=True,
        local_hbm_for_values=16 * row_bytes,  # a cache of 16 rows
    )
    keys = list(range(1, 41))
    assert _step(m, keys) == [float(k) for k in keys]  # all rejected
    assert _step(m, keys) == [float(k) for k in keys]  # all admitted, 24 beyond the cache
    assert _admission(m)[0].tolist() == [40, 40]
    # Every key is found (in the cache or the host table) and trained.
    assert _step(m, keys) == [float(k) - 1 for k in keys]
    assert _admission(m)[0].tolist() == [40, 40]

"""On the GPU: metrics add no device-to-host synchronization to a training
step, and a collection reads the counters with one copy.

Synchronizations are counted with ``torch.cuda.set_sync_debug_mode("warn")``,
which warns at every synchronizing CUDA call (device-to-host copies, ``item``,
``nonzero``, ...).
"""

import pytest
import torch

# Not installed on a GPU machine without the bundle's OpenTelemetry wheels
# (docs/testing.md); CI installs it (tools/setup_env.sh).
pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from dynamicemb import DynamicEmbTableOptions
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2, segmented_unique
from dynamicemb.metrics import StatCol, instrument
from dynamicemb.metrics.figures import TABLE
from tests.embedding.sync_guard import cuda_syncs

pytestmark = pytest.mark.gpu

FEATURES = [0, 1, 1]
BATCH = 512


def _module():
    opts = [
        DynamicEmbTableOptions(dim=16, max_capacity=4096, bucket_capacity=128) for _ in range(2)
    ]
    return BatchedDynamicEmbeddingTablesV2(opts, FEATURES, device="cuda", learning_rate=0.1)


def _batches(n):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        lengths = torch.randint(1, 4, (len(FEATURES) * BATCH,), generator=g)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        keys = torch.randint(0, 20000, (int(lengths.sum()),), generator=g)
        out.append((keys.cuda(), offsets.cuda()))
    return out


def _step(module, batch):
    keys, offsets = batch
    module(keys, offsets).sum().backward()


def test_training_step_syncs_as_often_with_metrics_as_without():
    plain, measured = _module(), _module()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reg = instrument(measured, meter_provider=provider)
    batches = _batches(6)
    for module in (plain, measured):  # warm-up
        _step(module, batches[0])
    counts = []
    for batch in batches[1:]:
        counts.append(
            (cuda_syncs(lambda: _step(plain, batch)), cuda_syncs(lambda: _step(measured, batch)))
        )
    print("synchronizations per step (without, with metrics):", counts)
    # A module's lazily built caches may synchronize once on a later step, so
    # a step may sync more without metrics; never more with them.
    assert all(with_ <= without for without, with_ in counts), counts
    assert reg.reads == 0  # nothing was read while training

    # A collection reads every counter with one device-to-host copy.
    assert cuda_syncs(reader.collect) == 1
    assert reg.reads == 1
    points = {
        m.name: {p.attributes[TABLE]: p.value for p in m.data.data_points}
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    counters = measured.rows.hash_table.counters.cpu()
    for t in range(2):
        name = f"table_{t}"
        assert points["dynamicemb.table.usage"][name] == int(counters[t, 0])
        assert points["dynamicemb.table.inserts"][name] == int(
            measured.rows.hash_table.counter("INSERTS")[t]
        )
        assert points["dynamicemb.memory.usage"][name] > 0
    provider.shutdown()


def test_counting_never_synchronizes():
    module = _module()
    keys, offsets = _batches(1)[0]
    tids = torch.repeat_interleave(
        torch.tensor(FEATURES, device="cuda").repeat_interleave(BATCH), offsets.diff()
    )
    su = segmented_unique(keys, tids, 2)
    admitted = su.counts > 1
    module.stats.feed(StatCol.ADMISSIONS)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        module.stats.count_lookups(su.table_offsets)
        module.stats.count_segments(StatCol.ADMISSIONS, admitted, su.table_offsets)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    counts = module.stats.counts.cpu()
    offsets_host = su.table_offsets.cpu()
    assert counts[:, StatCol.LOOKUPS].tolist() == offsets_host.diff().tolist()
    per_table = [
        int(admitted[offsets_host[t] : offsets_host[t + 1]].sum().item()) for t in range(2)
    ]
    assert counts[:, StatCol.ADMISSIONS].tolist() == per_table

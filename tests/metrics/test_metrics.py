"""dynamicemb.metrics on the CPU: the figures against the tables they read,
one reading per collection, the Prometheus endpoint, feeding by admission and
cache code, bad input."""

import gc
import subprocess
import sys
import textwrap
import urllib.request

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

import dynamicemb

# Not installed on a GPU machine without the bundle's OpenTelemetry wheels
# (docs/testing.md); CI installs it (tools/setup_env.sh).
pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from dynamicemb import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2, segmented_unique
from dynamicemb.metrics import (
    COLLECTION,
    FIGURES,
    MEMORY_TYPE,
    RANK,
    TABLE,
    StatCol,
    instrument,
    serve_prometheus,
)

TABLES = 3
FEATURES = [0, 1, 2, 2]  # table of each feature
BATCH = 64


def _module(capacity=256, strategy=DynamicEmbScoreStrategy.STEP, init=None, bucket=128, **options):
    opts = [
        DynamicEmbTableOptions(
            dim=4 + 4 * t,
            max_capacity=capacity,
            init_capacity=init,
            bucket_capacity=bucket,
            score_strategy=strategy,
            **options,
        )
        for t in range(TABLES)
    ]
    return BatchedDynamicEmbeddingTablesV2(opts, FEATURES, learning_rate=0.1)


def _batches(n, vocab=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(0, 4, (len(FEATURES) * BATCH,), generator=g)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        keys = torch.randint(0, vocab, (int(lengths.sum()),), generator=g)
        out.append((keys, offsets))
    return out


def _keys_per_table(keys, offsets, seen=None):
    """The keys of each table in a batch, as Python sets (added to ``seen``)."""
    seen = [set() for _ in range(TABLES)] if seen is None else seen
    for f, t in enumerate(FEATURES):
        lo, hi = int(offsets[f * BATCH]), int(offsets[(f + 1) * BATCH])
        seen[t].update(keys[lo:hi].tolist())
    return seen


def _distinct_per_table(keys, offsets):
    """Distinct keys of each table in a batch, by Python sets."""
    return [len(s) for s in _keys_per_table(keys, offsets)]


def _train(module, batches):
    for keys, offsets in batches:
        module(keys, offsets).sum().backward()


def _collect(reader):
    """{instrument name: {attributes as a sorted tuple: value}}."""
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = {
                    tuple(sorted(p.attributes.items())): p.value for p in m.data.data_points
                }
    return out


def _key(table, collection="c", rank=0, **extra):
    attrs = {COLLECTION: collection, TABLE: table, RANK: rank, **extra}
    return tuple(sorted(attrs.items()))


@pytest.fixture
def reader():
    r = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[r])
    yield r, provider
    provider.shutdown()


def test_figures_equal_the_tables(reader):
    r, provider = reader
    module = _module(capacity=256)
    batches = _batches(6)
    names = ["a", "b", "c"]
    instrument(module, collection="c", table_names=names, meter_provider=provider)
    _train(module, batches)
    got = _collect(r)
    assert set(got) == {f.name for f in FIGURES} - {
        "dynamicemb.table.admissions",
        "dynamicemb.table.rejections",
        "dynamicemb.table.refusals",
        "dynamicemb.cache.hits",
        "dynamicemb.cache.misses",
    }
    counters = module.rows.hash_table.counters
    lookups = [sum(x) for x in zip(*[_distinct_per_table(k, o) for k, o in batches])]
    # Every tensor the module's storage holds (the hash table's state and the
    # rows; all host memory on the CPU).
    rows = module.storage.rows_space
    host_bytes = (
        sum(
            x.nbytes
            for x in (
                module.rows.hash_table.keys,
                module.rows.hash_table.digests,
                module.rows.hash_table.scores,
                module.rows.hash_table.info,
                module.rows.hash_table.counters,
                module.rows.hash_table.free_rows,
            )
        )
        + rows.seg0.nbytes
        + rows.seg1.nbytes
    )
    memory = 0
    for t, name in enumerate(names):
        size = int(counters[t, 0])
        assert got["dynamicemb.table.usage"][_key(name)] == size
        assert got["dynamicemb.table.limit"][_key(name)] == 256
        assert got["dynamicemb.table.load_factor"][_key(name)] == pytest.approx(size / 256)
        assert got["dynamicemb.table.lookups"][_key(name)] == lookups[t]
        inserts = got["dynamicemb.table.inserts"][_key(name)]
        evictions = got["dynamicemb.table.evictions"][_key(name)]
        assert inserts == int(module.rows.hash_table.counter("INSERTS")[t])
        assert evictions == int(module.rows.hash_table.counter("EVICTIONS")[t])
        assert inserts - evictions == size
        assert got["dynamicemb.table.insert_failures"][_key(name)] == int(
            module.rows.hash_table.counter("INSERT_FAILURES")[t]
        )
        # The vocabulary is far larger than the tables: they fill and evict.
        assert size == 256 and evictions > 0
        assert got["dynamicemb.memory.usage"][_key(name, **{MEMORY_TYPE: "device"})] == 0
        memory += got["dynamicemb.memory.usage"][_key(name, **{MEMORY_TYPE: "host"})]
    assert memory == host_bytes


def test_one_device_read_per_collection(reader):
    r, provider = reader
    module = _module()
    reg = instrument(module, meter_provider=provider)
    _train(module, _batches(2))
    assert reg.reads == 0  # nothing is read while training
    for n in range(1, 4):
        r.collect()
        assert reg.reads == n
    # Counters keep counting between collections.
    before = _collect(r)["dynamicemb.table.lookups"]
    _train(module, _batches(1, seed=1))
    after = _collect(r)["dynamicemb.table.lookups"]
    assert all(after[k] > before[k] for k in before)


def test_no_sdk_reads_nothing():
    # No SDK configured in this process: OpenTelemetry's global provider is
    # the API's proxy and never calls the instruments back.
    assert type(otel_metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
    module = _module()
    reg = instrument(module)
    _train(module, _batches(2))
    assert reg.reads == 0


def test_library_needs_only_the_api():
    # In a process where the SDK cannot be imported: instrumenting and
    # training work, and nothing is read.
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry.sdk"] = None  # any import of the SDK fails
        import torch
        from dynamicemb import DynamicEmbTableOptions
        from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
        from dynamicemb.metrics import instrument
        opts = [DynamicEmbTableOptions(dim=4, max_capacity=128, bucket_capacity=128)]
        module = BatchedDynamicEmbeddingTablesV2(opts, learning_rate=0.1)
        registry = instrument(module)
        module(torch.arange(8), torch.arange(9)).sum().backward()
        print("reads", registry.reads)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "reads 0"


def test_registering_twice_and_dropping_dead_modules(reader):
    _, provider = reader
    module = _module()
    reg = instrument(module, meter_provider=provider)
    instrument(module, meter_provider=provider)
    assert reg.num_tables() == TABLES
    other = _module()
    instrument(other, meter_provider=provider)
    assert reg.num_tables() == 2 * TABLES
    del other
    gc.collect()
    assert reg.num_tables() == TABLES
    assert len(reg.read()) == TABLES


def test_rows_held_of_a_cached_table_count_the_rows_in_its_cache(reader):
    """A cache over a host table holds rows the host table does not (new keys
    enter the cache; only the ones it evicts are written back): rows held is
    every distinct key seen, as long as the host table has room for them all."""
    r, provider = reader
    dims = [4 + 4 * t for t in range(TABLES)]
    budgets = [64 * value_row_bytes(EmbOptimType.EXACT_SGD, d, torch.float32) for d in dims]
    opts = [
        DynamicEmbTableOptions(dim=d, max_capacity=4096, caching=True, local_hbm_for_values=b)
        for d, b in zip(dims, budgets)
    ]
    module = BatchedDynamicEmbeddingTablesV2(opts, FEATURES, learning_rate=0.1)
    instrument(module, collection="c", meter_provider=provider)
    batches = _batches(4, vocab=300)
    _train(module, batches)
    seen = None
    for keys, offsets in batches:
        seen = _keys_per_table(keys, offsets, seen)
    got = _collect(r)["dynamicemb.table.usage"]
    host = module.rows.hash_table.size().tolist()
    for t in range(TABLES):
        assert got[_key(f"table_{t}")] == len(seen[t])
        assert host[t] < len(seen[t])  # the host table alone misses the cached rows


def test_admission_and_cache_figures_join_when_fed(reader):
    r, provider = reader
    module = _module()
    instrument(module, collection="c", meter_provider=provider)
    fed = {
        StatCol.ADMISSIONS: "dynamicemb.table.admissions",
        StatCol.REJECTIONS: "dynamicemb.table.rejections",
        StatCol.REFUSALS: "dynamicemb.table.refusals",
        StatCol.CACHE_HITS: "dynamicemb.cache.hits",
        StatCol.CACHE_MISSES: "dynamicemb.cache.misses",
    }
    assert not set(fed.values()) & set(_collect(r))
    # What admission (and a cache tier) do per batch: declare the columns, then
    # count a mask over the distinct keys of each table.
    module.stats.feed(*fed)
    want = {col: [0] * TABLES for col in fed}
    g = torch.Generator().manual_seed(3)
    for keys, offsets in _batches(3):
        tids = torch.repeat_interleave(
            torch.tensor(FEATURES).repeat_interleave(BATCH), offsets.diff()
        )
        su = segmented_unique(keys, tids, TABLES)
        admitted = torch.rand(su.keys.numel(), generator=g) < 0.3
        hit = torch.rand(su.keys.numel(), generator=g) < 0.6
        masks = {
            StatCol.ADMISSIONS: admitted,
            StatCol.REJECTIONS: ~admitted,
            StatCol.REFUSALS: admitted & hit,
            StatCol.CACHE_HITS: hit,
            StatCol.CACHE_MISSES: ~hit,
        }
        for col, mask in masks.items():
            module.stats.count_segments(col, mask, su.table_offsets)
            for i in range(su.keys.numel()):
                want[col][int(su.table_ids[i])] += int(mask[i])
    got = _collect(r)
    for col, name in fed.items():
        assert got[name] == {_key(f"table_{t}"): want[col][t] for t in range(TABLES)}, name


@pytest.mark.parametrize(
    "options",
    [
        # Doubles its key map and rows as keys arrive.
        dict(capacity=64, strategy=DynamicEmbScoreStrategy.NO_EVICTION, init=16),
        # Buckets of 16 at load up to 1 evict before the table doubles.
        dict(capacity=4096, init=64, bucket=16, max_load_factor=1.0),
    ],
    ids=["no_eviction", "evicting"],
)
def test_counters_stay_monotonic_while_tables_grow(reader, options):
    """A collection at any moment, also in the middle of a table's doubling
    (which rebuilds the table), sees no cumulative counter go down and no
    table hold more rows than its limit."""
    _, provider = reader
    module = _module(**options)
    reg = instrument(module, meter_provider=provider)
    readings = []

    def read():
        readings.append({tuple(r.attributes.items()): r for r in reg.read()})

    # Every table operation, the rebuild's re-insert included, is followed by
    # a collection, as a scrape on another thread could be.
    run = module.rows.hash_table._run

    def run_and_read(*args, **kwargs):
        out = run(*args, **kwargs)
        read()
        return out

    module.rows.hash_table._run = run_and_read
    _train(module, _batches(6, vocab=5000))
    read()
    assert module.rows.hash_table.capacity(0) > 2 * (options["init"])  # the tables grew
    assert len(readings) > 8
    for key in readings[-1]:
        for col in ("INSERTS", "EVICTIONS", "INSERT_FAILURES"):
            values = [r[key].counters[col] for r in readings]
            assert values == sorted(values), (key, col)
        lookups = [r[key].stats[StatCol.LOOKUPS] for r in readings]
        assert lookups == sorted(lookups)
        assert all(r[key].counters["SIZE"] <= r[key].limit for r in readings)
    if "max_load_factor" in options:
        assert int(module.rows.hash_table.counter("EVICTIONS").sum()) > 0


def _scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_prometheus_endpoint():
    endpoint = serve_prometheus(0, "127.0.0.1", set_global=False)
    try:
        module = _module()
        instrument(module, collection="c", meter_provider=endpoint.meter_provider, rank=3)
        _train(module, _batches(2))
        samples = _scrape(endpoint.port)
    finally:
        endpoint.shutdown()

    def value(name, table):
        labels = {
            "dynamicemb_collection_name": "c",
            "dynamicemb_table_name": table,
            "dynamicemb_rank": "3",
            "otel_scope_name": "dynamicemb",
            "otel_scope_schema_url": "",
            "otel_scope_version": dynamicemb.__version__,
        }
        return samples[(name, tuple(sorted(labels.items())))]

    for t in range(TABLES):
        name = f"table_{t}"
        assert value("dynamicemb_table_evictions_total", name) == int(
            module.rows.hash_table.counter("EVICTIONS")[t]
        )
        assert value("dynamicemb_table_inserts_total", name) == int(
            module.rows.hash_table.counter("INSERTS")[t]
        )
        assert value("dynamicemb_table_usage", name) == int(module.rows.hash_table.size()[t])


def test_serve_prometheus_global_once():
    # In a process of its own: the global provider can be set only once.
    script = textwrap.dedent(
        """
        from dynamicemb.metrics import serve_prometheus
        first = serve_prometheus(0, "127.0.0.1")
        try:
            serve_prometheus(0, "127.0.0.1")
        except RuntimeError as e:
            print("refused:", e)
        first.shutdown()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "refused: serve_prometheus: a global OpenTelemetry MeterProvider is already set" in (
        out.stdout
    )


def test_serve_prometheus_retry_after_busy_port():
    # In a process of its own (the global provider is set once): a busy port
    # refused leaves the global provider unset, so a retry on a free port
    # becomes the global one and serves what instrument() registers.
    script = textwrap.dedent(
        """
        import socket, urllib.request
        import torch
        from opentelemetry import metrics
        from dynamicemb import DynamicEmbTableOptions
        from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
        from dynamicemb.metrics import instrument, serve_prometheus
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            serve_prometheus(port, "127.0.0.1")
        except OSError as e:
            print("busy:", type(e).__name__)
        print("global after refusal:", type(metrics.get_meter_provider()).__name__)
        endpoint = serve_prometheus(0, "127.0.0.1")
        print("global is the retry's:", metrics.get_meter_provider() is endpoint.meter_provider)
        opts = [DynamicEmbTableOptions(dim=4, max_capacity=128, bucket_capacity=128)]
        module = BatchedDynamicEmbeddingTablesV2(opts, learning_rate=0.1)
        instrument(module)
        module(torch.arange(8), torch.arange(9)).sum().backward()
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        text = urllib.request.urlopen(url, timeout=30).read().decode()
        print("served:", "dynamicemb_table_usage" in text)
        endpoint.shutdown()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "busy: OSError", out.stdout
    assert lines[1] == "global after refusal: _ProxyMeterProvider", out.stdout
    assert lines[2:] == ["global is the retry's: True", "served: True"], out.stdout


def test_bad_input(reader):
    _, provider = reader
    with pytest.raises(ValueError, match="holds no dynamic embedding tables"):
        instrument(torch.nn.Linear(2, 2), meter_provider=provider)
    module = _module()
    with pytest.raises(ValueError, match="2 table names for a module of 3 tables"):
        instrument(module, table_names=["x", "y"], meter_provider=provider)
    kept = _module()
    reg = instrument(kept, meter_provider=provider)
    with pytest.raises(TypeError, match="expected a BatchedDynamicEmbeddingTablesV2, got Linear"):
        reg.add(torch.nn.Linear(2, 2), "c", ["t"], 0)
    with pytest.raises(ValueError, match="port must be in"):
        serve_prometheus(70000)
    # Nothing of the refused calls was registered.
    assert reg.num_tables() == TABLES

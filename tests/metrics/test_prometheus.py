"""The main job's metrics, scraped by a real Prometheus and asked with PromQL.

Starts Debian's ``prometheus`` on a free port (tools/prometheus_server.py,
scrape interval 0.5 s), runs examples/train_dlrm.py on two gloo processes with
``--metrics-port`` (rank r serves /metrics on port + r), and checks what
Prometheus stored against the job's own summary.
"""

import time

import dist_launch  # examples/dist_launch.py (pyproject: pytest pythonpath)
import pytest
import train_dlrm

from tools.prometheus_server import PrometheusServer

WORLD_SIZE = 2
STEPS = 300
BATCH = 128
SCRAPE_INTERVAL = "500ms"


@pytest.fixture(scope="module")
def run():
    """(summary, Prometheus, start time, end time) of one job."""
    base = dist_launch.free_ports(WORLD_SIZE)
    targets = [f"127.0.0.1:{base + r}" for r in range(WORLD_SIZE)]
    with PrometheusServer(targets, scrape_interval=SCRAPE_INTERVAL) as prom:
        start = time.time()
        summary, out = train_dlrm.launch(
            f"--device cpu --world-size {WORLD_SIZE} --steps {STEPS} --batch-size {BATCH} "
            f"--eval-batches 2 --no-count-distinct --metrics-port {base} "
            "--metrics-address 127.0.0.1 --metrics-wait 30".split(),
            timeout=240,
        )
        assert summary is not None, out[-6000:]
        assert "was not scraped" not in out, out[-3000:]
        # Once every endpoint is seen down, all it served is stored.
        prom.wait_until_down()
        yield summary, prom, start, time.time()


def _by_table(prom, promql, at):
    result = prom.query(promql, at=at)
    return {labels["dynamicemb_table_name"]: value for labels, value in result}


def _last(metric):
    return f"sum by (dynamicemb_table_name) (last_over_time({metric}[1h]))"


def test_counters_equal_the_summary(run):
    summary, prom, _, end = run
    tables = summary["tables"]
    assert set(tables) == {"t_user", "t_item", "t_query"}
    for metric, field in [
        ("dynamicemb_table_evictions_total", "evictions"),
        ("dynamicemb_table_insert_failures_total", "insert_failures"),
        ("dynamicemb_table_inserts_total", "inserts"),
        ("dynamicemb_table_usage", "rows_held"),
        ("dynamicemb_table_limit", "capacity"),
    ]:
        got = _by_table(prom, _last(metric), end)
        want = {name: float(t[field]) for name, t in tables.items()}
        assert got == want, metric
    # The small table evicted all along: the test compares something.
    assert tables["t_item"]["evictions"] > 0


def test_series_per_rank_and_collection(run):
    _, prom, _, end = run
    series = prom.query("last_over_time(dynamicemb_table_usage[1h])", at=end)
    keys = {
        (s["dynamicemb_collection_name"], s["dynamicemb_table_name"], s["dynamicemb_rank"])
        for s, _ in series
    }
    assert keys == {
        ("model.sparse_arch", t, str(r)) for t in ("t_user", "t_item", "t_query") for r in range(2)
    }
    lookups = _by_table(prom, _last("dynamicemb_table_lookups_total"), end)
    inserts = _by_table(prom, _last("dynamicemb_table_inserts_total"), end)
    for name in inserts:
        # Every insert is a lookup that missed.
        assert lookups[name] >= inserts[name] > 0
    memory = prom.query(
        'sum(last_over_time(dynamicemb_memory_usage_bytes{dynamicemb_memory_type="host"}[1h]))',
        at=end,
    )
    assert memory and memory[0][1] > 0


def test_rows_never_exceed_capacity(run):
    _, prom, start, end = run
    over = prom.query_range("dynamicemb_table_usage - dynamicemb_table_limit", start, end, 0.5)
    assert len(over) == 3 * WORLD_SIZE
    for labels, values in over:
        assert max(v for _, v in values) <= 0, labels
    load = prom.query_range("dynamicemb_table_load_factor_ratio", start, end, 0.5)
    assert all(0 <= v <= 1 for _, values in load for _, v in values)


def test_figures_were_scraped_while_training(run):
    _, prom, start, end = run
    # Several scrapes saw the small table's evictions grow.
    evictions = prom.query_range(
        'sum(dynamicemb_table_evictions_total{dynamicemb_table_name="t_item"})', start, end, 0.5
    )
    values = sorted({v for _, v in evictions[0][1]})
    assert len(values) >= 3, values

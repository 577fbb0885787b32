"""The Grafana dashboard and docs/metrics.md name exactly the figures the
Prometheus exporter serves (every figure fed, from a real endpoint)."""

import json
import re
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
from prometheus_client.parser import text_string_to_metric_families

from dynamicemb import DynamicEmbTableOptions
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.metrics import FIGURES, StatCol, instrument, serve_prometheus
from dynamicemb.metrics.figures import COUNTER, GAUGE, UP_DOWN_COUNTER


def _docs() -> Path:
    for root in (Path.cwd(), Path(__file__).parents[2]):
        if (root / "docs" / "metrics.md").is_file():
            return root / "docs"
    raise FileNotFoundError("docs/metrics.md")


@pytest.fixture(scope="module")
def exported():
    """{Prometheus sample name: set of label names} of dynamicemb's figures,
    every figure fed."""
    endpoint = serve_prometheus(0, "127.0.0.1", set_global=False)
    try:
        opts = [DynamicEmbTableOptions(dim=4, max_capacity=128, bucket_capacity=128)]
        module = BatchedDynamicEmbeddingTablesV2(opts, learning_rate=0.1)
        module.stats.feed(*StatCol)
        instrument(module, collection="c", meter_provider=endpoint.meter_provider)
        module(torch.arange(8), torch.arange(9)).sum().backward()
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
    finally:
        endpoint.shutdown()
    out: dict[str, set] = {}
    families = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("dynamicemb_"):
                out.setdefault(s.name, set()).update(s.labels)
                families[s.name] = family.type
    return out, families


def _exprs(dashboard):
    return {
        p["title"]: " ".join(t["expr"] for t in p["targets"])
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


def test_dashboard_has_a_panel_per_figure(exported):
    names, _ = exported
    assert len(names) == len(FIGURES)
    with open(_docs() / "dashboards" / "dynamicemb.json") as f:
        dashboard = json.load(f)
    exprs = _exprs(dashboard)
    # Metric names are what a selector follows.
    used = {title: set(re.findall(r"(dynamicemb_[a-z_]+)\{", e)) for title, e in exprs.items()}
    # Each panel shows one figure, and each figure has a panel.
    for title, metrics in used.items():
        assert len(metrics) == 1, (title, metrics)
    shown = sorted(next(iter(m)) for m in used.values())
    assert shown == sorted(names)
    # Selectors and variables use labels the figures have.
    labels = set.union(*names.values())
    text = json.dumps(dashboard)
    for label in set(re.findall(r"\b(dynamicemb_[a-z_]+)\s*=~", text)):
        assert label in labels, label
    for var in dashboard["templating"]["list"][1:]:
        label = re.search(r",\s*(dynamicemb_[a-z_]+)\)$", var["query"]["query"]).group(1)
        assert label in labels, var["name"]


def test_docs_table_lists_every_figure(exported):
    names, families = exported
    kinds = {COUNTER: "Counter", UP_DOWN_COUNTER: "UpDownCounter", GAUGE: "Gauge"}
    rows = re.findall(
        r"^\| `([a-z_.]+)` \| `([a-z_]+)` \| (\w+) \| `([^`]+)` \| (.+) \|$",
        (_docs() / "metrics.md").read_text(),
        re.M,
    )
    assert [r[0] for r in rows] == [f.name for f in FIGURES]
    for (otel, prom, kind, unit, what), f in zip(rows, FIGURES):
        assert (kind, unit, what) == (kinds[f.kind], f.unit, f.description), otel
        assert prom in names, prom
        assert families[prom] == ("counter" if f.kind == COUNTER else "gauge"), prom
    assert sorted(r[1] for r in rows) == sorted(names)

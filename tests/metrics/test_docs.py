"""The Grafana dashboard and docs/metrics.md name exactly the figures the
Prometheus exporter serves (every figure fed, from a real endpoint), by
OpenTelemetry's Prometheus names (unit suffixes included); the endpoint names
its service and the meter's version; the dashboard selects by job and
instance, and says what a panel of a figure the job does not feed means."""

import json
import re
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
from prometheus_client.parser import text_string_to_metric_families

import dynamicemb
from dynamicemb import DynamicEmbTableOptions
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.metrics import FIGURES, StatCol, instrument, prometheus_name, serve_prometheus
from dynamicemb.metrics.figures import COUNTER, GAUGE, UP_DOWN_COUNTER

# Labels Prometheus itself gives every series it scrapes.
TARGET_LABELS = {"job", "instance"}


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
    scopes, targets = set(), []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("dynamicemb_"):
                out.setdefault(s.name, set()).update(s.labels)
                families[s.name] = family.type
                scopes.add((s.labels.get("otel_scope_name"), s.labels.get("otel_scope_version")))
            if s.name == "target_info":
                targets.append(s.labels)
    return out, families, scopes, targets


def _exprs(dashboard):
    return {
        p["title"]: " ".join(t["expr"] for t in p["targets"])
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


def test_the_endpoint_names_its_service_and_the_meter_version(exported):
    names, _, scopes, targets = exported
    assert sorted(names) == sorted(prometheus_name(f) for f in FIGURES)
    assert "dynamicemb_table_load_factor_ratio" in names  # unit 1: _ratio
    assert "dynamicemb_memory_usage_bytes" in names  # unit By: _bytes
    assert scopes == {("dynamicemb", dynamicemb.__version__)}
    assert [t.get("service_name") for t in targets] == ["dynamicemb"]


def test_dashboard_has_a_panel_per_figure(exported):
    names, *_ = exported
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
        label = re.search(r",\s*([a-z_]+)\)$", var["query"]["query"]).group(1)
        assert label in labels | TARGET_LABELS, var["name"]


def test_dashboard_selects_by_job_and_instance_and_says_what_is_not_fed():
    with open(_docs() / "dashboards" / "dynamicemb.json") as f:
        dashboard = json.load(f)
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables[:3] == ["datasource", "job", "instance"], variables
    # Two jobs on one Prometheus never merge: every query selects both.
    queries = list(_exprs(dashboard).values())
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"][2:]]
    for q in queries:
        assert 'job=~"$job"' in q, q
    for q in queries[:-1] + queries[-3:]:
        assert 'instance=~"$instance"' in q or q.endswith("instance)"), q
    # A figure fed only where a module has admission or a cache says so
    # instead of showing an empty panel.
    said = {}
    for p in dashboard["panels"]:
        if p["type"] == "row":
            continue
        metric = re.search(r"(dynamicemb_[a-z_]+)\{", p["targets"][0]["expr"]).group(1)
        said[metric] = p.get("fieldConfig", {}).get("defaults", {}).get("noValue")
    assert {f.needs for f in FIGURES} == {"", "admission", "cache"}
    for f in FIGURES:
        assert said[prometheus_name(f)] == (f"no {f.needs}" if f.needs else None), f.name


def test_docs_table_lists_every_figure(exported):
    names, families, *_ = exported
    kinds = {COUNTER: "Counter", UP_DOWN_COUNTER: "UpDownCounter", GAUGE: "Gauge"}
    rows = re.findall(
        r"^\| `([a-z_.]+)` \| `([a-z_]+)` \| (\w+) \| `([^`]+)` \| (.+) \|$",
        (_docs() / "metrics.md").read_text(),
        re.M,
    )
    assert [r[0] for r in rows] == [f.name for f in FIGURES]
    for (otel, prom, kind, unit, what), f in zip(rows, FIGURES):
        assert (kind, unit, what) == (kinds[f.kind], f.unit, f.description), otel
        assert prom == prometheus_name(f) and prom in names, prom
        assert families[prom] == ("counter" if f.kind == COUNTER else "gauge"), prom
    assert sorted(r[1] for r in rows) == sorted(names)

"""OpenTelemetry metrics of dynamic embedding tables.

Per table and rank: how full each table is, what it inserts, evicts and fails
to insert, how many keys it looks up, what admission admits and rejects, how
a cache tier hits, and the memory it takes (``FIGURES``; docs/metrics.md).
The instruments are made through ``opentelemetry-api`` alone, on the meter
``dynamicemb``: where no SDK is configured they cost nothing. They are
observable: the device counters are read when a collection asks, never in a
training step.

    from dynamicemb.metrics import instrument, serve_prometheus

    serve_prometheus(9464)      # optional: SDK + Prometheus endpoint
    instrument(model)           # the model's dynamic tables on this rank
"""

try:
    import opentelemetry.metrics  # noqa: F401 (the instruments' API)
except ImportError as e:
    raise ImportError(
        "dynamicemb.metrics needs OpenTelemetry's API (opentelemetry-api): install the extra "
        "dynamicemb[opentelemetry], or dynamicemb[prometheus] for serve_prometheus's "
        f"endpoint too ({e})"
    ) from e

from dynamicemb.metrics.figures import (
    COLLECTION,
    FIGURES,
    MEMORY_TYPE,
    METER_NAME,
    RANK,
    TABLE,
    Figure,
    TableReading,
    prometheus_name,
)
from dynamicemb.metrics.prometheus import PrometheusEndpoint, prometheus_views, serve_prometheus
from dynamicemb.metrics.registry import MetricsRegistry, instrument, registry
from dynamicemb.storage.stats import StatCol, TableStats

__all__ = [
    "COLLECTION",
    "FIGURES",
    "MEMORY_TYPE",
    "METER_NAME",
    "RANK",
    "TABLE",
    "Figure",
    "MetricsRegistry",
    "PrometheusEndpoint",
    "StatCol",
    "TableReading",
    "TableStats",
    "instrument",
    "prometheus_name",
    "prometheus_views",
    "registry",
    "serve_prometheus",
]

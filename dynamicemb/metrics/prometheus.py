"""One-call setup: the OpenTelemetry SDK with a Prometheus endpoint.

    from dynamicemb.metrics import instrument, serve_prometheus

    serve_prometheus(9464)      # http://<host>:9464/metrics
    instrument(model)           # after DistributedModelParallel

Needs ``opentelemetry-sdk`` and ``opentelemetry-exporter-prometheus`` (the
extra ``dynamicemb[prometheus]``; the library itself needs only
``opentelemetry-api``). The provider's resource names the service
(``service.name``: ``OTEL_SERVICE_NAME``, else ``dynamicemb``), which the
exporter serves as ``target_info``; Prometheus adds ``job`` and ``instance``
to every series it scrapes, so several jobs share one Prometheus. A program
that configures OpenTelemetry itself adds a ``PrometheusMetricReader`` (or
any reader) to its own MeterProvider instead, with ``prometheus_views()``,
and calls ``instrument`` alone.
"""

import os
from dataclasses import dataclass
from typing import Any

from dynamicemb.metrics.figures import FIGURES, UNIT_SUFFIXES

# The service a provider of serve_prometheus names when OTEL_SERVICE_NAME is unset.
DEFAULT_SERVICE_NAME = "dynamicemb"


def prometheus_views() -> list:
    """OpenTelemetry SDK views that give Prometheus the names of
    ``figures.prometheus_name``: a figure of unit ``1`` gets its ``_ratio``
    suffix (the Prometheus exporter adds none for that unit)."""
    from opentelemetry.sdk.metrics.view import View

    return [
        View(instrument_name=f.name, name=f.name + UNIT_SUFFIXES["1"])
        for f in FIGURES
        if f.unit == "1"
    ]


def _sdk():
    """The SDK and the exporter, or an ImportError naming the extra."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as e:
        raise ImportError(
            "serve_prometheus needs opentelemetry-sdk and opentelemetry-exporter-prometheus: "
            f"install the extra dynamicemb[prometheus] ({e})"
        ) from e
    return (
        PrometheusMetricReader,
        MeterProvider,
        SERVICE_NAME,
        Resource,
        CollectorRegistry,
        start_http_server,
    )


@dataclass
class PrometheusEndpoint:
    """A running ``/metrics`` endpoint.

    Attributes:
        meter_provider: the SDK MeterProvider whose reader the endpoint serves.
        address (str): the address it listens on.
        port (int): its port (the one chosen when 0 was asked).
    """

    meter_provider: Any
    address: str
    port: int
    _server: Any

    def shutdown(self) -> None:
        """Stops serving and shuts the MeterProvider down."""
        self._server.shutdown()
        self._server.server_close()
        self.meter_provider.shutdown()


def serve_prometheus(
    port: int,
    address: str = "0.0.0.0",
    set_global: bool = True,
    service_name: str | None = None,
) -> PrometheusEndpoint:
    """Configures an OpenTelemetry SDK MeterProvider with a Prometheus reader
    and serves its figures over HTTP at ``/metrics``.

    Args:
        port (int): TCP port; 0 picks a free one (see ``.port``).
        address (str): address to listen on (default: every interface).
        set_global (bool): make the provider OpenTelemetry's global one, which
            ``instrument(model)`` uses by default. With False, pass
            ``endpoint.meter_provider`` to ``instrument``.
        service_name (Optional[str]): the resource's ``service.name`` (served
            as the ``target_info`` series); default ``OTEL_SERVICE_NAME``, else
            ``"dynamicemb"``.

    Returns:
        PrometheusEndpoint: the endpoint; ``shutdown()`` stops it.

    Raises:
        ImportError: the SDK or the exporter is missing (the message names
            the extra ``dynamicemb[prometheus]``).
        RuntimeError: ``set_global`` and a global MeterProvider is already set
            (OpenTelemetry allows it once per process); nothing is left
            running.
        OSError: the port cannot be bound; nothing is left running and the
            global MeterProvider is untouched, so a call on another port
            works.

    Example::

        from dynamicemb.metrics import instrument, serve_prometheus

        endpoint = serve_prometheus(0, service_name="ctr-trainer")  # a free port
        instrument(model, meter_provider=endpoint.meter_provider)
        print(f"http://localhost:{endpoint.port}/metrics")
    """
    from opentelemetry import metrics

    reader, meter_provider, service, resource, collector_registry, start_http_server = _sdk()
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    # A registry of its own: only this provider's figures (and target_info).
    registry = collector_registry()
    provider = meter_provider(
        metric_readers=[reader(registry=registry)],
        resource=resource.create({service: name}),
        views=prometheus_views(),
    )
    # The port first: a refused call leaves no provider behind, global or not
    # (OpenTelemetry takes a global provider once per process, so a provider
    # made global before a failed bind would block every retry).
    try:
        server, _ = start_http_server(int(port), address, registry=registry)
    except BaseException:
        provider.shutdown()
        raise
    endpoint = PrometheusEndpoint(provider, address, server.server_port, server)
    if set_global:
        metrics.set_meter_provider(provider)
        if metrics.get_meter_provider() is not provider:
            endpoint.shutdown()
            raise RuntimeError(
                "serve_prometheus: a global OpenTelemetry MeterProvider is already set "
                f"({type(metrics.get_meter_provider()).__name__}); add a PrometheusMetricReader "
                "to it, or call serve_prometheus(..., set_global=False) and pass "
                "endpoint.meter_provider to instrument()"
            )
    return endpoint

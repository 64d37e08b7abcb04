"""``/metrics`` of a train or eval pod over HTTP (I/O: one thread serving the Prometheus text format).

A pod serves on ``RLKUBE_METRICS_PORT`` (the env contract); 0 or unset serves nothing. A port
already taken is logged, not fatal: a pod runs without metrics rather than not at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)


class _Union(Collector):
    """Several registries served as one."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self.registries = tuple(registries)

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            yield from registry.collect()


class MetricsServer:
    """Serves ``registries`` at ``http://host:port/metrics`` until :meth:`close`."""

    def __init__(self, registries: Sequence[CollectorRegistry], *, port: int, host: str = "0.0.0.0") -> None:
        self.registries = tuple(registries)
        self.host = host
        self.requested_port = port
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        self._httpd, self._thread = start_http_server(
            self.requested_port,
            addr=self.host,
            registry=_Union(self.registries),
        )
        return self

    @property
    def port(self) -> int:
        return int(self._httpd.server_port) if self._httpd is not None else 0

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(registries: Sequence[CollectorRegistry], *, port: int) -> MetricsServer | None:
    """Start serving on ``port``; None when ``port`` is 0 or cannot be bound (logged)."""
    if port <= 0:
        return None
    try:
        server = MetricsServer(registries, port=port).start()
    except OSError as exc:
        logger.warning("metrics: cannot serve on port %d (%s); this pod exports no metrics", port, exc)
        return None
    logger.info("metrics on http://0.0.0.0:%d/metrics", server.port)
    return server

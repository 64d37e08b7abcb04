"""Prometheus metrics and the liveness endpoint of the operator (I/O: one aiohttp server).

``GET /healthz`` answers 200 while the operator's event loop runs (the loop serving it is the one
kopf runs on, so a wedged loop cannot answer) with the age of the last status refresh;
``GET /metrics`` is the Prometheus text format. Both on RLKUBE_METRICS_PORT (default 8080).

Metrics (all prefixed ``rlkube_operator_``):

* ``reconciles_total{handler}``           reconciles done, by handler (create, update, resume, scale, status)
* ``reconcile_errors_total{handler}``     reconciles that raised (API errors, invalid specs)
* ``reconcile_duration_seconds{handler}`` histogram of reconcile time
* ``jobs{phase}``                         RLJobs seen by this operator, by phase
* ``coordinator_unreachable_total``       GetStatus calls that got no answer within the deadline
* ``applies_total{kind}``                 server-side applies sent, by object kind
* ``leader``                              1 while this replica holds the leader-election Lease
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rlkube_operator.status import Phase

REGISTRY = CollectorRegistry(auto_describe=True)
RECONCILES = Counter(
    "rlkube_operator_reconciles_total", "Reconciles done, by handler.", ["handler"], registry=REGISTRY
)
ERRORS = Counter(
    "rlkube_operator_reconcile_errors_total",
    "Reconciles that failed, by handler.",
    ["handler"],
    registry=REGISTRY,
)
DURATION = Histogram(
    "rlkube_operator_reconcile_duration_seconds",
    "Time of one reconcile, by handler.",
    ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
JOBS = Gauge("rlkube_operator_jobs", "RLJobs seen by this operator, by phase.", ["phase"], registry=REGISTRY)
UNREACHABLE = Counter(
    "rlkube_operator_coordinator_unreachable_total",
    "GetStatus calls without an answer within the deadline.",
    registry=REGISTRY,
)
APPLIES = Counter(
    "rlkube_operator_applies_total", "Server-side applies sent, by kind.", ["kind"], registry=REGISTRY
)


class JobPhases:
    """The phase of every job this operator serves, behind the ``jobs{phase}`` gauge."""

    def __init__(self) -> None:
        self._phases: dict[str, Phase] = {}
        for phase in Phase:
            JOBS.labels(phase=phase.value).set(0)

    def set(self, key: str, phase: Phase) -> None:
        self._phases[key] = phase
        self._publish()

    def forget(self, key: str) -> None:
        self._phases.pop(key, None)
        self._publish()

    def _publish(self) -> None:
        for phase in Phase:
            JOBS.labels(phase=phase.value).set(sum(1 for p in self._phases.values() if p is phase))


PHASES = JobPhases()


@contextmanager
def measured(handler: str) -> Iterator[None]:
    """Count and time one reconcile; an exception counts as an error and propagates."""
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        ERRORS.labels(handler=handler).inc()
        raise
    finally:
        RECONCILES.labels(handler=handler).inc()
        DURATION.labels(handler=handler).observe(time.perf_counter() - start)


LEADER = Gauge(
    "rlkube_operator_leader",
    "1 while this replica holds the leader-election Lease (standalone: 0)",
    registry=REGISTRY,
)


class Heartbeat:
    """The time of the last status refresh of any job, reported by /healthz."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()


HEARTBEAT = Heartbeat()


#: The paths the operator serves; the Helm chart's probes and ServiceMonitor use them.
HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"


def build_app() -> web.Application:
    """The HTTP application behind RLKUBE_METRICS_PORT: /healthz and /metrics."""

    async def healthz(_: web.Request) -> web.Response:
        age = round(time.monotonic() - HEARTBEAT.last, 1)
        return web.json_response({"status": "ok", "secondsSinceLastStatusRefresh": age})

    async def metrics(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(REGISTRY))
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return response

    app = web.Application()
    app.router.add_get(HEALTH_PATH, healthz)
    app.router.add_get(METRICS_PATH, metrics)
    return app


async def start_server(*, port: int) -> web.AppRunner:
    """Serve :func:`build_app` on ``port``; stop with ``runner.cleanup()``."""
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner

"""gRPC health checking (``grpc.health.v1``) for every pod: what kubelet's native ``grpc:`` probes ask.

I/O (a small gRPC server). Two services:

- ``""`` (overall): SERVING as long as the process answers. The liveness probe asks it, so a
  process that stops answering (SIGSTOP, a hung interpreter, a machine out of memory) is
  restarted by the kubelet; the pod's work goes back to the queue when its lease expires.
- ``"readiness"``: SERVING while the pod does its job: an eval worker while it is registered
  with the coordinator, a train rank once it has joined training (rank 0: once its coordinator
  serves). The readiness probe asks it.

Every pod serves them on :data:`rlkube.contract.HEALTH_PORT` (its own small server, started
before the role's heavy imports); rank 0 also serves them on the coordinator's port. The process
has one :data:`POD` health, as it has one set of probes.
"""

from __future__ import annotations

import logging
import os
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlkube import contract

logger = logging.getLogger(__name__)

READINESS = contract.READINESS_SERVICE
OVERALL = health.OVERALL_HEALTH
#: Overrides the health port (``0``: any free port; the local launcher sets it, its "pods" share a host).
HEALTH_PORT_ENV = "RLKUBE_HEALTH_PORT"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Collector:
    """Stands in for a server to take the handlers ``add_HealthServicer_to_server`` registers."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, *_: Any) -> None:
        pass


class PodHealth:
    """The health of this process: alive while it answers, ready when its role says so."""

    def __init__(self) -> None:
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        self.servicer.set(OVERALL, _SERVING)
        self.servicer.set(READINESS, _NOT_SERVING)
        self._server: grpc.Server | None = None
        self.port = 0

    def ready(self, value: bool = True) -> None:
        self.servicer.set(READINESS, _SERVING if value else _NOT_SERVING)

    def handler(self) -> grpc.GenericRpcHandler:
        """The Health service as a handler for another server (rank 0's coordinator)."""
        collector = _Collector()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, collector)
        return collector.handlers[0]

    def serve(self, port: int | None = None, *, host: str = "0.0.0.0") -> PodHealth:
        """Serve on ``port`` (default: $RLKUBE_HEALTH_PORT, else ``contract.HEALTH_PORT``).

        A port that cannot be bound is logged, not fatal: the pod works, its probes fail.
        """
        if port is None:
            port = int(os.environ.get(HEALTH_PORT_ENV, contract.HEALTH_PORT))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
        server.add_generic_rpc_handlers((self.handler(),))
        try:
            self.port = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:
            logger.warning("health checks are not served: cannot listen on %s:%d (%s)", host, port, exc)
            return self
        if self.port == 0:
            logger.warning("health checks are not served: cannot listen on %s:%d", host, port)
            return self
        server.start()
        self._server = server
        return self

    def close(self) -> None:
        self.servicer.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(0)
            self._server = None


#: This process's health (one per pod).
POD = PodHealth()

"""Fake coordinators: ``PolicyGroup.GetStatus`` on one unix socket per job, answering a set report.

The operator finds them through ``RLKUBE_COORDINATOR_ADDRESS`` (see
:class:`rlkube_devcluster.operator_process.OperatorProcess`); ``make cluster --simulate-training``
and the operator tests set the reports.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from rlkube._proto import policy_group_pb2 as pb
from rlkube._proto import policy_group_pb2_grpc as pb_grpc


class _Coordinator(pb_grpc.PolicyGroupServicer):
    def __init__(self, owner: FakeCoordinators, key: str) -> None:
        self.owner = owner
        self.key = key

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.JobStatus:
        with self.owner.lock:
            self.owner.calls[self.key] = self.owner.calls.get(self.key, 0) + 1
            return pb.JobStatus(**self.owner.reports.get(self.key, {"phase": "Starting"}))


class FakeCoordinators:
    """GetStatus servers on unix sockets ``<dir>/<namespace>.<job>.sock``; ``report(...)`` sets the answer."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.lock = threading.Lock()
        self.reports: dict[str, dict[str, Any]] = {}
        self.calls: dict[str, int] = {}
        self.servers: dict[str, grpc.Server] = {}

    def serve(self, namespace: str, job: str) -> None:
        key = f"{namespace}.{job}"
        if key in self.servers:
            return
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PolicyGroupServicer_to_server(_Coordinator(self, key), server)
        server.add_insecure_port(f"unix://{self.socket_dir}/{key}.sock")
        server.start()
        self.servers[key] = server

    def report(self, namespace: str, job: str, **fields: Any) -> None:
        self.serve(namespace, job)
        with self.lock:
            self.reports[f"{namespace}.{job}"] = fields

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop(grace=None)
        self.servers.clear()

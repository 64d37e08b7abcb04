"""Processes for the operator tests: the real operator, the real kubectl, fake coordinators.

* :class:`OperatorProcess` runs ``python -m rlkube.cli operator -A`` against an emulated cluster.
* :func:`kubectl` runs /usr/bin/kubectl with the cluster's kubeconfig (the emulator serves
  OpenAPI v3, so kubectl's default validation works; older tests still pass ``--validate=false``).
* :class:`FakeCoordinators` serves ``PolicyGroup.GetStatus`` on one unix socket per job, with a
  report each test sets (the operator finds it through RLKUBE_COORDINATOR_ADDRESS).
* :func:`wait_for` polls a condition with a generous deadline (no sleep-and-assert).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

import grpc
from rlkube._proto import policy_group_pb2 as pb
from rlkube._proto import policy_group_pb2_grpc as pb_grpc
from rlkube.launch.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
T = TypeVar("T")


class OperatorExited(RuntimeError):
    """The operator process is gone; waiting longer cannot help."""


def wait_for(check: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.1, what: str = "") -> T:
    """Return the first truthy ``check()``; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except OperatorExited:
            raise
        except Exception as exc:  # a check may race with the object's creation
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}; last: {last!r}")
        time.sleep(interval)


def kubectl(
    kubeconfig: Path, *args: str, input: str | None = None, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if not Path(KUBECTL).is_file():
        import pytest

        if os.environ.get("CI"):  # CI must run the operator tests, not skip them quietly
            pytest.fail(f"kubectl is not installed (looked on PATH and at {KUBECTL}); CI needs it")
        pytest.skip("kubectl is not installed")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cache = kubeconfig.parent / "kubectl-cache"
    result = subprocess.run(
        [KUBECTL, "--cache-dir", str(cache), *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


class OperatorProcess:
    """The operator as `rlkube operator` runs it, with settings suited to tests."""

    def __init__(
        self, kubeconfig: Path, *, socket_dir: Path, log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.metrics_port = free_port()
        self.log_path = log
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("runtime", "operator", ".")),
            "RLKUBE_METRICS_PORT": str(self.metrics_port),
            "RLKUBE_STATUS_INTERVAL": "0.5",
            "RLKUBE_COORDINATOR_TIMEOUT": "0.5",
            "RLKUBE_COORDINATOR_ADDRESS": f"unix://{socket_dir}/{{namespace}}.{{job}}.sock",
            "RLKUBE_WATCH_SERVER_TIMEOUT": "60",
            "RLKUBE_WATCH_CLIENT_TIMEOUT": "75",
            "RLKUBE_DEFAULT_IMAGE": "rlkube:test",
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        # The whole cluster unless the environment names namespaces.
        self.scope = [] if self.env.get("RLKUBE_WATCH_NAMESPACES") else ["--all-namespaces"]

    def start(self) -> OperatorProcess:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rlkube.cli", "operator", *self.scope],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self.healthy, timeout=90, interval=0.2, what="the operator's /healthz")
        return self

    def healthy(self) -> bool:
        import urllib.request

        if self.process is not None and self.process.poll() is not None:
            raise OperatorExited(f"the operator exited with {self.process.returncode}:\n{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            return answer.read().decode()

    def rss_bytes(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        self.process = None


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

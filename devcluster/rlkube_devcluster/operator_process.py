"""The real operator as a process, as `rlkube operator` runs it, with settings suited to a dev cluster.

:class:`OperatorProcess` runs ``python -m rlkube.cli operator -A`` against an emulated cluster's
kubeconfig, finds each job's coordinator at ``unix://<socket_dir>/<namespace>.<job>.sock`` (where
:class:`rlkube_devcluster.coordinators.FakeCoordinators` or a process kubelet's proxy answers) and
serves ``/healthz`` and ``/metrics`` on a free port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from rlkube.launch.processes import free_port

from rlkube_devcluster import REPO
from rlkube_devcluster.waiting import OperatorExited, wait_for


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
            "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("runtime", "operator", ".")),
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

"""Helpers to run `rlkube run` as a local cluster from tests and watch it from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient
from rlkube.security.credential import Credential

ROOT = Path(__file__).resolve().parents[2]

#: A CartPole job small enough that an epoch takes about a second on a busy 2-core machine.
SMALL_JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "small"},
    "spec": {
        "policy": {
            "type": "PPO",
            "modelCfg": {"hiddenSizes": [32, 32]},
            "algoCfg": {"updateEpochs": 2},
            "weightBuffer": {"strategy": "Shared"},
        },
        "env": {"id": "CartPole-v1", "numEnvs": 4},
        "train": {
            "maxEpochs": 12,
            "stepsPerEpoch": 256,
            "fragmentLength": 16,
            "batchSize": 64,
            "evalInterval": 0,
            "saveInterval": 2,
        },
        "trainer": {"replicas": 1},
        "evaluator": {"replicas": 2},
        "log": {"intervalSeconds": 0.5},
    },
}


def write_job(directory: Path, **spec_overrides: Any) -> Path:
    job = json.loads(json.dumps(SMALL_JOB))
    for dotted, value in spec_overrides.items():
        node = job["spec"]
        *parents, last = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


class LocalRun:
    """`rlkube run JOB --run-dir DIR` in the background, with views of its status and processes."""

    def __init__(self, job_file: Path, run_dir: Path, *args: str) -> None:
        self.run_dir = run_dir
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT)]),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlkube.cli",
                "run",
                str(job_file),
                "--run-dir",
                str(run_dir),
                "--no-progress",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.output = ("", "")
        self._client: PolicyGroupClient | None = None
        self.seen_pids: set[int] = set()
        self.shm_root: str | None = None

    # ----------------------------------------------------------------- views
    def cluster(self) -> dict[str, Any]:
        try:
            data = json.loads((self.run_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}
        self.seen_pids |= {pod["pid"] for pod in data.get("pods", {}).values()}
        self.seen_pids |= set(data.get("standby", {}).values())
        self.shm_root = data.get("shm_root", self.shm_root)
        return data

    def status(self) -> pb.JobStatus | None:
        if self._client is None:
            address = self.cluster().get("coordinator")
            if not address:
                return None
            token = self.cluster().get("token_file")
            credential = Credential.from_file(Path(token)) if token else None
            self._client = PolicyGroupClient(address, credential=credential)
        try:
            return self._client.status(timeout=2.0)
        except CoordinatorError:
            return None

    def wait_until(
        self, predicate: Callable[[pb.JobStatus], bool], *, timeout: float, what: str
    ) -> pb.JobStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(
                    f"the run ended (rc {self.proc.returncode}) before {what}:\n{out}\n{err}"
                )
            self.cluster()
            status = self.status()
            if status is not None and predicate(status):
                return status
            time.sleep(0.3)
        raise AssertionError(
            f"timed out after {timeout:.0f} s waiting for {what}; last status: {self.status()}"
        )

    def pid_of(self, pod: str) -> int:
        return int(self.cluster()["pods"][pod]["pid"])

    def scale(self, evaluators: int) -> None:
        from rlkube.launch.local import write_control

        write_control(self.run_dir, evaluators)

    # ----------------------------------------------------------------- ending
    def wait(self, timeout: float) -> int:
        try:
            self.output = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"the run did not finish in {timeout:.0f} s; logs in {self.run_dir / 'logs'}"
            ) from None
        return self.proc.returncode

    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.output = self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.output = self.proc.communicate()
        if self._client is not None:
            self._client.close()

    def leftovers(self) -> list[int]:
        """Pods of this run that are still alive (must be none once it ended)."""
        alive = []
        for pid in self.seen_pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):  # an exited pod nobody reaped (its supervisor died) is gone
                alive.append(pid)
        return alive

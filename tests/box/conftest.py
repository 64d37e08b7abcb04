"""Cluster-in-a-box (testing tier 4): the API emulator with the process kubelet; helpers to watch it.

Pods here are real processes of this machine. Tests read them through kubectl and through the
kubelet's own view (``ProcessKubelet.processes`` on the emulator's loop), never through sleeps.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rlkube.launch.processes import RestartBackOff
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.emulator.store import WatchEvent
from rlkube_devcluster.kubelet.process_kubelet import ProcessKubelet
from rlkube_devcluster.operator_process import OperatorProcess

from tests.operator.conftest import Kubectl
from tests.operator.harness import ROOT

_COUNTER = itertools.count()


@dataclass(frozen=True)
class Seen:
    at: float  # time.monotonic() when stored
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]


@dataclass
class Box:
    cluster: EmulatedCluster
    kubelet: ProcessKubelet
    workdir: Path

    def processes(self, namespace: str) -> dict[str, dict[str, Any]]:
        """pod name -> pid, restarts, node, as the kubelet sees them now."""
        found = self.cluster.call(self.kubelet.processes)
        return {name: info for (ns, name), info in found.items() if ns == namespace}

    def claim(self, namespace: str, name: str) -> Path:
        """The directory of PersistentVolumeClaim ``name``."""
        return self.workdir / "claims" / namespace / name

    def record(self, kind: str) -> list[Seen]:
        """From now on, every write of ``kind`` objects as the API server stored it, in order."""
        seen: list[Seen] = []

        def listen(rtype: Any, event: WatchEvent) -> None:
            if rtype.kind == kind:
                seen.append(Seen(time.monotonic(), event.type, event.obj))

        self.cluster.call(lambda: self.cluster.store_call().listeners.append(listen))
        return seen


def start_box(workdir: Path, **kubelet_options: Any) -> Box:
    options = {
        "nodes": 2,
        "backoff": RestartBackOff(initial=0.5, cap=2.0, reset_after=60.0),
        "max_grace": 10.0,
        **kubelet_options,
    }
    kubelet = ProcessKubelet(workdir, **options)
    cluster = EmulatedCluster(workdir, kubelet=kubelet, crds=[ROOT / "crds" / "rljob.yaml"]).start()
    return Box(cluster, kubelet, workdir)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    started = start_box(tmp_path_factory.mktemp("box"))
    yield started
    started.cluster.stop()


@pytest.fixture
def k(box: Box) -> Kubectl:
    name = f"b{next(_COUNTER)}"
    box.cluster.create_namespace(name)
    return Kubectl(box.cluster, name)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def pid_of(pod: dict[str, Any]) -> int:
    return int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))


def python_container(
    script: str, *, env: list[dict[str, Any]] = (), mounts: list[dict[str, Any]] = ()
) -> dict:
    return {
        "name": "main",
        "image": "python",
        "command": ["python", "-c", script],
        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, *env],
        "volumeMounts": list(mounts),
    }


def statefulset(
    name: str,
    container: dict[str, Any],
    *,
    replicas: int = 1,
    volumes: list[dict[str, Any]] = (),
    grace: int = 30,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name, **(labels or {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": grace,
                    "containers": [container],
                    "volumes": list(volumes),
                },
            },
        },
    }


def pod(k: Kubectl, name: str) -> dict[str, Any] | None:
    return k.get("pod", name)


def running_pods(k: Kubectl, count: int) -> dict[str, dict[str, Any]] | None:
    """The namespace's pods when exactly ``count`` are Running and Ready, else None."""
    pods = json.loads(k("get", "pods", "-o", "json").stdout)["items"]
    ready = {
        p["metadata"]["name"]: p
        for p in pods
        if p.get("status", {}).get("phase") == "Running"
        and all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])
    }
    return ready if len(ready) == count == len(pods) else None


def start_operator(box: Box) -> OperatorProcess:
    """The real operator on ``box``, refreshing status every second (coordinator calls time out in 2 s)."""
    return OperatorProcess(
        box.cluster.operator_kubeconfig,
        socket_dir=box.kubelet.socket_dir,
        log=box.workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "1", "RLKUBE_COORDINATOR_TIMEOUT": "2"},
    ).start()

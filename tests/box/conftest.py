"""Cluster-in-a-box (testing tier 4): the real control plane with node agents that run pods as
processes of this machine (``rlkube_devcluster.real_cluster``), and helpers to watch it.

One cluster serves the whole run (``real_cluster`` in tests/conftest.py); each test gets a
namespace of its own, deleted after it. Tests read pods through kubectl and through the node
agents' own view (:meth:`RealCluster.processes`), never through sleeps.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.real_cluster import RealCluster

from tests.conftest import delete_namespace
from tests.operator.conftest import Kubectl, new_namespace
from tests.operator.harness import Seen, Watch

__all__ = ["Box", "Seen"]

_COUNTER = itertools.count()


@dataclass
class Box:
    cluster: RealCluster
    watches: list[Watch] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.cluster.workdir

    def processes(self, namespace: str) -> dict[str, dict[str, Any]]:
        """pod name -> pid, restarts, node, as the node agents see them now."""
        return {name: info for (ns, name), info in self.cluster.processes().items() if ns == namespace}

    def claim(self, namespace: str, name: str) -> Path:
        """The directory of PersistentVolumeClaim ``name``."""
        return self.cluster.claim(namespace, name)

    def pod_dirs(self, namespace: str, prefix: str) -> list[Path]:
        """The node agents' directories of the namespace's pods whose names start with ``prefix``."""
        return sorted(self.workdir.glob(f"nodes/*/disk/pods/{namespace}_{prefix}*"))

    def container_logs(self, namespace: str, pod: str) -> list[Path]:
        """The log file of each start of the pod's container, oldest first."""
        found = self.workdir.glob(f"nodes/*/logs/{namespace}_{pod}_*/*.log")
        return sorted(found, key=lambda p: int(p.stem))

    def provide_claim(self, k: Kubectl, name: str) -> Path:
        """A PersistentVolumeClaim ``name`` bound to a PersistentVolume of its own, as on a cluster
        without a provisioner (the scheduler binds no pod whose claim is unbound); its directory."""
        volume = f"{k.namespace}-{name}"
        claim = self.claim(k.namespace, name)
        documents = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "hostPath": {"path": str(claim)},
                    "claimRef": {"namespace": k.namespace, "name": name},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": k.namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        ]
        k("apply", "-f", "-", input=yaml.safe_dump_all(documents))
        return claim

    def record(self, k: Kubectl, kind: str) -> list[Seen]:
        """From now on, every version of the namespace's ``kind`` objects the API server sends, in order."""
        watch = Watch(self.cluster.kubeconfig, k.namespace, kind)
        self.watches.append(watch)
        return watch.seen

    def stop_watches(self) -> None:
        while self.watches:
            self.watches.pop().stop()


@pytest.fixture(scope="module")
def box(real_cluster: RealCluster) -> Iterator[Box]:
    started = Box(real_cluster)
    yield started
    started.stop_watches()


FAILED = pytest.StashKey[bool]()
#: How much of each container log a failed test prints (its last lines).
LOG_TAIL_LINES = 40


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture
def k(box: Box, request: pytest.FixtureRequest) -> Iterator[Kubectl]:
    """A namespace of the test's own, deleted (without waiting) after it: its pods stop.

    A failed test first prints what the namespace held: its RLJobs' status, its pods, and the
    last lines of every container start's log (what a user would look at with kubectl).
    """
    name = f"b{next(_COUNTER)}"
    new_namespace(box.cluster.plane, name)
    kubectl = Kubectl(box.cluster.plane, name)
    yield kubectl
    if request.node.stash.get(FAILED, False):
        print(describe_namespace(box, kubectl))
    delete_namespace(box.cluster.kubeconfig, name)


def describe_namespace(box: Box, k: Kubectl) -> str:
    """The namespace's RLJobs (status), pods (phase, restarts) and container logs' last lines."""
    lines = [f"--- namespace {k.namespace} after the failure"]
    for job in listed(k, "rlj"):
        lines.append(f"RLJob {job['metadata']['name']} status:")
        lines.append(yaml.safe_dump(job.get("status", {}), sort_keys=False).rstrip())
    for pod in listed(k, "pod"):
        status = pod.get("status", {})
        restarts = [c.get("restartCount", 0) for c in status.get("containerStatuses") or []]
        lines.append(f"pod {pod['metadata']['name']}: {status.get('phase')}, restarts {restarts}")
    for log in sorted(box.workdir.glob(f"nodes/*/logs/{k.namespace}_*/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        lines.append(f"--- {log.parent.name}/{log.name} (last {len(tail)} lines)")
        lines.extend(tail)
    return "\n".join(lines)


def listed(k: Kubectl, kind: str) -> list[dict[str, Any]]:
    result = k("get", kind, "-o", "json", check=False)
    return list(json.loads(result.stdout).get("items", [])) if result.returncode == 0 else []


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


def start_operator(box: Box, log: str = "operator.log") -> OperatorProcess:
    """The real operator on ``box``, refreshing status every second (coordinator calls time out in 2 s)."""
    return OperatorProcess(
        box.cluster.kubeconfig,
        socket_dir=box.cluster.socket_dir,  # the node agents' coordinator proxies: <ns>.<job>.sock
        log=box.workdir / log,
        env={"RLKUBE_STATUS_INTERVAL": "1", "RLKUBE_COORDINATOR_TIMEOUT": "2"},
    ).start()

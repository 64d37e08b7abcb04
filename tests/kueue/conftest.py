"""The real control plane with a real Kueue (v0.17.0, built from its Go module) and the operator.

One cluster for the package (starting etcd, Kubernetes, Kueue and two node agents takes a while on
2 cores); each test works in namespaces and queues of its own. Kueue's manager is built before the
first test starts (``make test`` builds it first with ``make kueue``; run alone, collection does it,
outside every test's timeout); without Go the tests are skipped, saying so.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlkube.launch.processes import RestartBackOff
from rlkube_devcluster.controlplane.build import BuildError
from rlkube_devcluster.kueue.build import ensure_kueue
from rlkube_devcluster.kueue.manager import KueueManager
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.real_cluster import RealCluster
from rlkube_devcluster.waiting import wait_for

from tests.operator.harness import kubectl

_HERE = Path(__file__).parent
_NAMES = itertools.count()
_UNAVAILABLE: list[str] = []


@pytest.hookimpl(trylast=True)  # after -m and -k deselected what will not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build Kueue (once per machine) before any test that needs the cluster runs, or skip those."""
    ours = [
        item
        for item in items
        if _HERE in Path(str(item.fspath)).parents and "kueue_cluster" in getattr(item, "fixturenames", ())
    ]
    if not ours:
        return
    reason = KueueManager.unavailable_reason()
    if reason is None:
        try:
            ensure_kueue()
        except BuildError as exc:
            reason = f"Kueue could not be built: {exc}"
    if reason is not None:
        _UNAVAILABLE.append(reason)
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=reason))


class KueueCluster:
    """The cluster, the operator, and kubectl as cluster-admin."""

    def __init__(self, cluster: RealCluster, operator: OperatorProcess) -> None:
        self.cluster = cluster
        self.operator = operator

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return kubectl(self.cluster.kubeconfig, *args, input=input, check=check)

    def apply(self, *documents: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        scope = ["-n", namespace] if namespace else []
        result = self.kubectl("get", kind, name, *scope, "-o", "json", check=False)
        return dict(json.loads(result.stdout)) if result.returncode == 0 else None

    def items(self, kind: str, namespace: str, *selector: str) -> list[dict[str, Any]]:
        result = self.kubectl("get", kind, "-n", namespace, *selector, "-o", "json")
        return list(json.loads(result.stdout)["items"])

    def namespace(self) -> str:
        name = f"kq{next(_NAMES)}"
        self.kubectl("create", "namespace", name)
        wait_for(lambda: self.kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0)
        return name

    def logs(self) -> str:
        """Where to look when a wait times out."""
        kueue = self.cluster.kueue.log if self.cluster.kueue else None
        return f"operator log {self.operator.log_path}; Kueue log {kueue}"


@pytest.fixture(scope="package")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KueueCluster]:
    cluster = RealCluster(
        tmp_path_factory.mktemp("kueue"), nodes=2, backoff=RestartBackOff(initial=0.5, cap=2.0), kueue=True
    )
    operator = OperatorProcess(
        cluster.kubeconfig,
        socket_dir=cluster.socket_dir,
        log=cluster.workdir / "operator.log",
        env={"RLKUBE_STATUS_INTERVAL": "1", "RLKUBE_COORDINATOR_TIMEOUT": "2"},
    )
    try:
        cluster.start()
        operator.start()
        yield KueueCluster(cluster, operator)
    finally:
        operator.stop()
        cluster.stop()

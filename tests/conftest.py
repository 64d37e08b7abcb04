"""Shared fixtures. Test modules are grouped by behaviour (spec/, policy/, weights/, operator/, ...)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane
    from rlkube_devcluster.real_cluster import RealCluster

MINIMAL_JOB: dict[str, Any] = {
    "apiVersion": "rlkube.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "cartpole"},
    "spec": {"env": {"id": "CartPole-v1"}},
}


@pytest.fixture
def minimal_job() -> dict[str, Any]:
    """The smallest valid RLJob manifest (a fresh copy per test)."""
    return copy.deepcopy(MINIMAL_JOB)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real Kubernetes control plane (etcd, API server, controller-manager, scheduler), one per run.

    ``make test`` builds its binaries before pytest starts (``make controlplane``); run alone, the
    first use on a machine builds them here.
    """
    from rlkube_devcluster.controlplane.cluster import ControlPlane

    plane = ControlPlane(tmp_path_factory.mktemp("k8s")).start()
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def rljob_crd(control_plane: ControlPlane) -> None:
    """The CRD of crds/ (RLJob), applied and Established (served)."""
    import json

    from rlkube_devcluster.waiting import wait_for

    from tests.operator.harness import ROOT, kubectl

    kubectl(control_plane.kubeconfig, "apply", "-f", str(ROOT / "crds"))

    def established() -> bool:
        crd = json.loads(
            kubectl(control_plane.kubeconfig, "get", "crd", "rljobs.rlkube.io", "-o", "json").stdout
        )
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, what="the RLJob CRD to be Established")


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """The cluster-in-a-box, one per run: a control plane of its own (its Nodes must attract only
    the pods of the tests that use it), the RLJob CRD, and two node agents that run pods as
    processes, restarting crashed containers on a short back-off (0.5 s doubling to 2 s)."""
    from rlkube.launch.processes import RestartBackOff
    from rlkube_devcluster.real_cluster import RealCluster

    cluster = RealCluster(
        tmp_path_factory.mktemp("box"),
        nodes=2,
        backoff=RestartBackOff(initial=0.5, cap=2.0, reset_after=60.0),
        max_grace=10.0,
    ).start()
    yield cluster
    cluster.stop()


def delete_namespace(kubeconfig: Path, name: str) -> None:
    """Delete a test's namespace: its RLJobs at once (so the next module's operator never finds nor
    reconciles them), the rest without waiting (its pods stop as the namespace controller deletes them)."""
    from tests.operator.harness import kubectl

    kubectl(kubeconfig, "-n", name, "delete", "rljobs", "--all", "--timeout=120s", check=False)
    kubectl(kubeconfig, "delete", "namespace", name, "--wait=false", check=False)

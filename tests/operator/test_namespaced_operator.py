"""An operator limited to some namespaces (RLKUBE_WATCH_NAMESPACES) serves those and leaves the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.emulator.cluster import EmulatedCluster
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl
from tests.operator.manifests import job_document


@pytest.fixture(scope="module")
def operator(
    cluster: EmulatedCluster, coordinators: FakeCoordinators, workdir: Path
) -> Iterator[OperatorProcess]:
    cluster.create_namespace("served")
    process = OperatorProcess(
        cluster.operator_kubeconfig,
        socket_dir=coordinators.socket_dir,
        log=workdir / "operator.log",
        env={"RLKUBE_WATCH_NAMESPACES": "served"},
    ).start()
    yield process
    process.stop()


def test_jobs_in_a_served_namespace_get_children_and_others_do_not(
    cluster: EmulatedCluster, operator: OperatorProcess, k: Kubectl
) -> None:
    served = Kubectl(cluster, "served")
    served.apply(job_document("here"))
    k.apply(job_document("elsewhere"))
    served.wait_for_object("statefulset", "here-train")
    wait_for(lambda: (served.get("rlj", "here") or {}).get("status", {}).get("phase"))
    # The served job got its status, so the operator has run its loop past the other job too.
    assert k.get("statefulset", "elsewhere-train") is None
    assert "status" not in (k.get("rlj", "elsewhere") or {})

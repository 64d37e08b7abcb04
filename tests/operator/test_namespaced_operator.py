"""An operator limited to some namespaces (RLKUBE_WATCH_NAMESPACES) serves those and leaves the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.kubelet.node_agent import NodeAgent
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.conftest import delete_namespace
from tests.operator.conftest import Kubectl, new_namespace, start_operator

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane
from tests.operator.manifests import job_document


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane,
    operator_role: str,
    stand_in_node: NodeAgent,
    coordinators: FakeCoordinators,
    workdir: Path,
    operator_user: str,
) -> Iterator[OperatorProcess]:
    new_namespace(control_plane, "served")
    process = start_operator(
        control_plane, coordinators, workdir, operator_user, env={"RLKUBE_WATCH_NAMESPACES": "served"}
    )
    yield process
    process.stop()
    delete_namespace(control_plane.kubeconfig, "served")


def test_jobs_in_a_served_namespace_get_children_and_others_do_not(
    control_plane: ControlPlane, operator: OperatorProcess, k: Kubectl
) -> None:
    served = Kubectl(control_plane, "served")
    served.apply(job_document("here"))
    k.apply(job_document("elsewhere"))
    served.wait_for_object("statefulset", "here-train")
    wait_for(lambda: (served.get("rlj", "here") or {}).get("status", {}).get("phase"))
    # The served job got its status, so the operator has run its loop past the other job too.
    assert k.get("statefulset", "elsewhere-train") is None
    assert "status" not in (k.get("rlj", "elsewhere") or {})

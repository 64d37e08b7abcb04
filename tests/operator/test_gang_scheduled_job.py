"""A gang-scheduled RLJob through the real operator: its PodGroup reaches the API server.

The real API server serves Volcano's and scheduler-plugins' PodGroup CRDs built from their
vendored schemas (tests/scheduling/schemas), so what the operator applies is admitted, pruned and
checked by those projects' own schemas, as on a cluster with the scheduler installed. (No such
scheduler runs here: the pods stay Pending, which these tests do not look at.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import yaml
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl
from tests.operator.harness import kubectl
from tests.operator.manifests import job_document
from tests.scheduling.schemas import FILES, HERE

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

GPU = {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "1", "memory": "2Gi"}}


def pod_group_crd(api_version: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"podgroups.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": "PodGroup",
                "plural": "podgroups",
                "singular": "podgroup",
                "listKind": "PodGroupList",
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": yaml.safe_load((HERE / FILES[api_version]).read_text())},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


@pytest.fixture(scope="module", autouse=True)
def pod_group_crds(control_plane: ControlPlane) -> None:
    documents = yaml.safe_dump_all([pod_group_crd(api_version) for api_version in FILES])
    kubectl(control_plane.kubeconfig, "apply", "-f", "-", input=documents)
    for api_version in FILES:
        group = api_version.split("/")[0]
        kubectl(
            control_plane.kubeconfig,
            "wait",
            "--for=condition=Established",
            f"crd/podgroups.{group}",
            "--timeout=120s",
        )


@pytest.mark.parametrize(
    ("scheduling", "api_version", "members"),
    [
        ({"gang": "volcano", "queue": "research"}, "scheduling.volcano.sh/v1beta1", "minMember"),
        ({"gang": "coscheduling", "scheduleTimeoutSeconds": 90}, "scheduling.x-k8s.io/v1alpha1", "minMember"),
    ],
)
def test_a_gang_job_gets_its_pod_group_owned_by_the_job(
    k: Kubectl, operator: OperatorProcess, scheduling: dict[str, Any], api_version: str, members: str
) -> None:
    name = scheduling["gang"]
    k.apply(job_document(name, trainer={"replicas": 3, "resources": GPU}, scheduling=scheduling))
    plural = f"podgroups.{api_version.split('/')[0]}"
    group = k.wait_for_object(plural, f"{name}-train")
    assert group["spec"][members] == 3
    assert group["spec"]["minResources"] == {"cpu": "3", "memory": "6Gi", "nvidia.com/gpu": "3"}
    job = k.get("rlj", name)
    assert job is not None
    assert group["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    train = k.wait_for_object("statefulset", f"{name}-train")
    pod = train["spec"]["template"]
    assert pod["spec"]["schedulerName"] in ("volcano", "scheduler-plugins-scheduler")
    budget = k.wait_for_object("poddisruptionbudget", f"{name}-train")
    assert budget["spec"]["minAvailable"] == 3


def test_eval_scaling_of_a_gang_job_leaves_its_pod_group_alone(k: Kubectl, operator: OperatorProcess) -> None:
    k.apply(job_document("elastic", trainer={"replicas": 2}, scheduling={"gang": "volcano"}))
    before = k.wait_for_object("podgroups.scheduling.volcano.sh", "elastic-train")
    k("scale", "rlj/elastic", "--replicas=5")
    wait_for(
        lambda: (k.get("statefulset", "elastic-eval") or {}).get("spec", {}).get("replicas") == 5,
        what="eval scaled",
    )
    after = k.get("podgroups.scheduling.volcano.sh", "elastic-train")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

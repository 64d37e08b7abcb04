"""Thirty malformed RLJobs are each refused at apply or failed by the operator, naming the field,
while the operator keeps reconciling the good ones.

The jobs the operator must fail itself are stored as under an older, looser CRD: the RLJob CRD is
replaced by one without CEL rules and bounds, the jobs are created, and crds/rljob.yaml is applied
again, as an upgrade of the CRD leaves jobs it would now refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.conftest import delete_namespace
from tests.operator.conftest import Kubectl, new_namespace
from tests.operator.harness import ROOT
from tests.operator.manifests import MALFORMED, job_document, malformed

if TYPE_CHECKING:
    from rlkube_devcluster.controlplane.cluster import ControlPlane

CRD = ROOT / "crds" / "rljob.yaml"

#: Stored under an older, looser CRD (no CEL, no bounds): the operator must fail them itself.
STORED_UNCHECKED: list[tuple[str, Any, str]] = [
    ("spec.train.batchSize", 4096, "spec.train.batchSize"),
    ("spec.trainer.backend", "nccl", "spec.trainer.backend"),
    ("spec.evaluator.env", [{"name": "MASTER_ADDR", "value": "x"}], "spec.evaluator.env"),
    ("spec.train.maxEpochs", 0, "spec.train.maxEpochs"),
    ("spec.env.numEnvs", 5000, "spec.env.numEnvs"),
]


def test_there_are_thirty_malformed_jobs() -> None:
    # Each is refused at apply by the API server: tests/kubernetes/test_admission.py.
    assert len(MALFORMED) == 30


#: What an older CRD did not check: CEL rules and numeric bounds.
LOOSER = ("x-kubernetes-validations", "minimum", "maximum")


def loosened(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: loosened(value) for key, value in node.items() if key not in LOOSER}
    if isinstance(node, list):
        return [loosened(value) for value in node]
    return node


def stored_unchecked_name(index: int) -> str:
    return f"loose{index}"


@pytest.fixture(scope="module")
def loose(control_plane: ControlPlane, rljob_crd: None, operator: OperatorProcess) -> Iterator[Kubectl]:
    """A namespace holding the STORED_UNCHECKED jobs, created under a looser CRD; the CRD restored."""
    namespace = "loose"
    new_namespace(control_plane, namespace)
    k = Kubectl(control_plane, namespace)
    crd = yaml.safe_load(CRD.read_text())
    k("apply", "-f", "-", input=yaml.safe_dump(loosened(crd)))
    try:
        for index, (path, value, _) in enumerate(STORED_UNCHECKED):
            document = malformed(index, path, value)
            document["metadata"]["name"] = stored_unchecked_name(index)
            # The API server serves the new schema a moment after the CRD changes.
            wait_for(
                lambda document=document: (
                    k("create", "-f", "-", input=yaml.safe_dump(document), check=False).returncode == 0
                ),
                what=f"{document['metadata']['name']} stored under the looser CRD",
            )
    finally:
        k("apply", "-f", str(CRD))
    refused = malformed(0, *STORED_UNCHECKED[0][:2])
    wait_for(
        lambda: (
            k("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(refused), check=False).returncode
            != 0
        ),
        what="crds/rljob.yaml's schema served again",
    )
    yield k
    delete_namespace(control_plane.kubeconfig, namespace)


@pytest.mark.parametrize(
    ("index", "case"),
    list(enumerate(STORED_UNCHECKED)),
    ids=[f"{p}={v!r}"[:50] for p, v, _ in STORED_UNCHECKED],
)
def test_a_malformed_job_the_schema_let_through_fails_with_invalid_spec(
    loose: Kubectl, index: int, case: tuple[str, Any, str]
) -> None:
    _, _, field = case
    name = stored_unchecked_name(index)
    k = loose
    job = wait_for(
        lambda: (j := k.get("rlj", name)) and j.get("status", {}).get("phase") == "Failed" and j,
        what=f"{name} to fail",
    )
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert field in failed["message"]
    assert k.get("statefulset", f"{name}-train") is None  # nothing was created for it
    events = k("get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    assert "InvalidSpec" in events


def test_the_operator_still_reconciles_good_jobs_after_the_bad_ones(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(k.namespace, "good", phase="Running", epoch=1, max_epochs=5)
    k.apply(job_document("good"))
    k.wait_for_object("statefulset", "good-train")
    wait_for(lambda: (k.get("rlj", "good") or {}).get("status", {}).get("phase") == "Running")
    assert operator.healthy()
    assert 'rlkube_operator_jobs{phase="Failed"}' in operator.metrics()

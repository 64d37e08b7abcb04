"""Thirty malformed RLJobs are each refused at apply or failed by the operator, naming the field,
while the operator keeps reconciling the good ones."""

from __future__ import annotations

from typing import Any

import pytest
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl
from tests.operator.manifests import MALFORMED, job_document, malformed

#: Stored as if under an older, looser CRD (no CEL, no bounds): the operator must fail them itself.
STORED_UNCHECKED: list[tuple[str, Any, str]] = [
    ("spec.train.batchSize", 4096, "spec.train.batchSize"),
    ("spec.trainer.backend", "nccl", "spec.trainer.backend"),
    ("spec.evaluator.env", [{"name": "MASTER_ADDR", "value": "x"}], "spec.evaluator.env"),
    ("spec.train.maxEpochs", 0, "spec.train.maxEpochs"),
    ("spec.env.numEnvs", 5000, "spec.env.numEnvs"),
]


def test_there_are_thirty_malformed_jobs() -> None:
    assert len(MALFORMED) == 30


@pytest.mark.parametrize(
    ("index", "case"), list(enumerate(MALFORMED)), ids=[f"{p}={v!r}"[:50] for p, v, _ in MALFORMED]
)
def test_a_malformed_job_is_refused_at_apply_naming_the_field(
    k: Kubectl, operator: OperatorProcess, index: int, case: tuple[str, Any, str]
) -> None:
    path, value, field = case
    result = k.apply(malformed(index, path, value), check=False)
    assert result.returncode != 0, result.stdout
    assert field in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("index", "case"),
    list(enumerate(STORED_UNCHECKED)),
    ids=[f"{p}={v!r}"[:50] for p, v, _ in STORED_UNCHECKED],
)
def test_a_malformed_job_the_schema_let_through_fails_with_invalid_spec(
    k: Kubectl, operator: OperatorProcess, index: int, case: tuple[str, Any, str]
) -> None:
    path, value, field = case
    name = f"loose{index}"
    document = malformed(index, path, value)
    document["metadata"]["name"] = name
    store = k.cluster.emulator.store  # type: ignore[union-attr]
    rtype = store.find("rlkube.io", "v1alpha1", "rljobs")
    k.cluster.call(store.create, rtype, k.namespace, document, admit=False)
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

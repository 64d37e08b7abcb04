"""Restarting the operator resumes every job without touching its pods (resume is an idempotent apply)."""

from __future__ import annotations

import json

from rlkube import contract as c
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl
from tests.operator.manifests import job_document


def snapshot(k: Kubectl, job: str) -> dict[str, object]:
    pods = json.loads(k("get", "pods", "-l", f"{c.LABEL_JOB}={job}", "-o", "json").stdout)["items"]
    train, evals = k.get("statefulset", f"{job}-train"), k.get("statefulset", f"{job}-eval")
    assert train is not None
    assert evals is not None
    return {
        "pods": sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in pods),
        "generations": (train["metadata"]["generation"], evals["metadata"]["generation"]),
        "versions": (train["metadata"]["resourceVersion"], evals["metadata"]["resourceVersion"]),
    }


def test_an_operator_restart_leaves_running_jobs_alone(
    k: Kubectl, operator: OperatorProcess, coordinators: FakeCoordinators
) -> None:
    coordinators.report(k.namespace, "steady", phase="Running", epoch=4, max_epochs=9, weight_version=4)
    k.apply(job_document("steady", trainer={"replicas": 2}, evaluator={"replicas": 2}))
    wait_for(lambda: (k.get("rlj", "steady") or {}).get("status", {}).get("phase") == "Running")
    wait_for(lambda: (k.get("statefulset", "steady-eval") or {}).get("status", {}).get("readyReplicas") == 2)
    before = snapshot(k, "steady")

    operator.stop()
    coordinators.report(k.namespace, "steady", phase="Running", epoch=5, max_epochs=9, weight_version=5)
    operator.start()

    wait_for(lambda: (k.get("rlj", "steady") or {}).get("status", {}).get("progress", {}).get("epoch") == 5)
    assert snapshot(k, "steady") == before

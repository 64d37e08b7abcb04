"""Thirty malformed RLJobs are each refused at apply or failed by the operator, naming the field,
while the operator keeps reconciling the good ones."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rlkube_devcluster.coordinators import FakeCoordinators
from rlkube_devcluster.operator_process import OperatorProcess
from rlkube_devcluster.waiting import wait_for

from tests.operator.conftest import Kubectl, job_document

# (what is set, value, field path the error must name)
MALFORMED: list[tuple[str, Any, str]] = [
    ("spec.train.maxEpochs", -3, "spec.train.maxEpochs"),
    ("spec.train.maxEpochs", "many", "spec.train.maxEpochs"),
    ("spec.train.stepsPerEpoch", 0, "spec.train.stepsPerEpoch"),
    ("spec.engine", "turbo", "spec.engine"),
    ("spec.policy.rolloutMode", "parallel", "spec.policy.rolloutMode"),
    ("spec.policy.weightBuffer.strategy", "Triple", "spec.policy.weightBuffer.strategy"),
    ("spec.policy.weightBuffer.chunkBytes", 10, "spec.policy.weightBuffer.chunkBytes"),
    ("spec.policy.weightBuffer.streams", 65, "spec.policy.weightBuffer.streams"),
    ("spec.env.numEnvs", 0, "spec.env.numEnvs"),
    ("spec.env.id", "", "spec.env.id"),
    ("spec.env.vectorization", "threads", "spec.env.vectorization"),
    ("spec.trainer.replicas", 0, "spec.trainer.replicas"),
    ("spec.trainer.backend", "mpi", "spec.trainer.backend"),
    ("spec.evaluator.replicas", -1, "spec.evaluator.replicas"),
    ("spec.runPolicy.cleanPodPolicy", "Some", "spec.runPolicy.cleanPodPolicy"),
    ("spec.runPolicy.backoffLimit", -1, "spec.runPolicy.backoffLimit"),
    ("spec.runPolicy.activeDeadlineSeconds", 0, "spec.runPolicy.activeDeadlineSeconds"),
    ("spec.log.level", "loud", "spec.log.level"),
    ("spec.log.intervalSeconds", 0, "spec.log.intervalSeconds"),
    ("spec.buffer.type", "ring", "spec.buffer.type"),
    ("spec.train.fragmentLength", 0, "spec.train.fragmentLength"),
    ("spec.policy.modelCfg", [1, 2], "spec.policy.modelCfg"),
    ("spec.trainer.resources.limits", {"cpu": "lots"}, "spec.trainer.resources.limits"),
    ("spec.trainer.env", [{"value": "1"}], "spec.trainer.env[0].name"),
    ("spec.train.batchSize", 4096, "spec.train.batchSize"),  # CEL: more than stepsPerEpoch
    ("spec.trainer.backend", "nccl", "spec.trainer.backend"),  # CEL: nccl without GPUs
    ("spec.engine", "eval", "spec.checkpoint.path"),  # CEL: eval needs a checkpoint
    ("spec.evaluator.env", [{"name": "RANK", "value": "1"}], "spec.evaluator.env"),  # CEL: reserved
    ("spec.trainer.env", [{"name": "PET_NNODES", "value": "1"}], "spec.trainer.env"),  # CEL: reserved
    ("metadata.name", "x" * 41, "metadata.name"),
]

#: Stored as if under an older, looser CRD (no CEL, no bounds): the operator must fail them itself.
STORED_UNCHECKED: list[tuple[str, Any, str]] = [
    ("spec.train.batchSize", 4096, "spec.train.batchSize"),
    ("spec.trainer.backend", "nccl", "spec.trainer.backend"),
    ("spec.evaluator.env", [{"name": "MASTER_ADDR", "value": "x"}], "spec.evaluator.env"),
    ("spec.train.maxEpochs", 0, "spec.train.maxEpochs"),
    ("spec.env.numEnvs", 5000, "spec.env.numEnvs"),
]


def malformed(index: int, path: str, value: Any) -> dict[str, Any]:
    document = job_document(f"bad{index}")
    node = document
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = copy.deepcopy(value)
    return document


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

"""The real API server admits RLJobs by the CRD: its schema, its defaults and its CEL rules.

The malformed jobs of tests/operator/manifests.py (the one table of them), judged by
kube-apiserver itself: what it refuses, the field it names, and what it fills in.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.kubernetes.conftest import Kube
from tests.operator.manifests import MALFORMED, job_document, malformed

pytestmark = pytest.mark.usefixtures("rljob_crd")


@pytest.mark.parametrize(
    ("index", "case"), list(enumerate(MALFORMED)), ids=[f"{p}={v!r}"[:50] for p, v, _ in MALFORMED]
)
def test_a_malformed_job_is_refused_naming_the_field(
    kube: Kube, index: int, case: tuple[str, Any, str]
) -> None:
    path, value, field = case
    document = malformed(index, path, value)
    result = kube.apply(document)
    assert result.returncode != 0, result.stdout
    assert field in result.stderr, result.stderr
    assert kube.get("rlj", document["metadata"]["name"]) is None


def test_the_server_fills_in_every_default_of_an_omitted_section(kube: Kube) -> None:
    assert kube.apply({**job_document("defaults"), "spec": {"env": {"id": "CartPole-v1"}}}).returncode == 0
    job = kube.get("rlj", "defaults")
    assert job is not None
    spec = job["spec"]
    assert spec["scheduling"] == {"gang": "none", "kueueIntegration": "StatefulSet", "disruptionBudget": True}
    assert spec["train"]["maxEpochs"] == 100
    assert spec["policy"]["weightBuffer"]["strategy"] == "Shared"
    assert spec["engine"] == "sync"


def test_a_partly_given_section_gets_the_rest_of_its_defaults(kube: Kube) -> None:
    result = kube.apply(job_document("partial", scheduling={"gang": "volcano", "queue": "research"}))
    assert result.returncode == 0, result.stderr
    job = kube.get("rlj", "partial")
    assert job is not None
    assert job["spec"]["scheduling"] == {
        "gang": "volcano",
        "queue": "research",
        "kueueIntegration": "StatefulSet",
        "disruptionBudget": True,
    }


@pytest.mark.parametrize(
    ("scheduling", "field"),
    [
        ({"gang": "kueue"}, "spec.scheduling.queue"),
        ({"queue": "research"}, "spec.scheduling.queue"),
        ({"gang": "volcano", "scheduleTimeoutSeconds": 30}, "spec.scheduling.scheduleTimeoutSeconds"),
    ],
)
def test_the_scheduling_rules_run_on_the_defaulted_section(
    kube: Kube, scheduling: dict[str, Any], field: str
) -> None:
    result = kube.apply(job_document("gang", scheduling=scheduling))
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


def test_a_typo_in_a_new_job_is_refused_naming_the_field(kube: Kube) -> None:
    result = kube.apply(job_document("typo", evaluator={"replica": 3}))
    assert result.returncode != 0
    assert 'strict decoding error: unknown field "spec.evaluator.replica"' in result.stderr
    assert kube.get("rlj", "typo") is None


def test_a_typo_in_an_update_is_refused_and_the_job_is_unchanged(kube: Kube) -> None:
    document = job_document("edited")
    assert kube.apply(document).returncode == 0
    before = kube.get("rlj", "edited")
    changed = copy.deepcopy(document)
    changed["spec"]["evaluator"]["replica"] = 3
    result = kube.apply(changed)
    assert 'unknown field "spec.evaluator.replica"' in result.stderr
    after = kube.get("rlj", "edited")
    assert before is not None
    assert after is not None
    assert after["spec"] == before["spec"]


def test_server_side_apply_is_strict_too(kube: Kube) -> None:
    result = kube.apply(job_document("ssa", train={"maxEpoch": 3}), "--server-side")
    assert result.returncode != 0
    # Server-side apply builds a typed patch first: its words are not strict decoding's.
    assert ".spec.train.maxEpoch: field not declared in schema" in result.stderr


def test_without_strict_validation_the_unknown_field_is_pruned(kube: Kube) -> None:
    result = kube.apply(job_document("lenient", evaluator={"replica": 3}), "--validate=false")
    assert result.returncode == 0, result.stderr
    job = kube.get("rlj", "lenient")
    assert job is not None
    assert "replica" not in job["spec"]["evaluator"]


def test_explain_describes_the_rljob_spec_from_the_servers_schema(kube: Kube) -> None:
    spec = kube("explain", "rlj.spec").stdout
    assert "KIND:       RLJob" in spec
    assert "VERSION:    v1alpha1" in spec
    for field in ("engine", "env", "evaluator", "trainer", "scheduling", "runPolicy"):
        assert f"  {field}\t<" in spec, field
    gang = kube("explain", "rlj.spec.scheduling.gang").stdout
    assert "ENUM:" in gang
    assert "coscheduling" in gang


def test_explain_of_an_unknown_field_fails(kube: Kube) -> None:
    result = kube("explain", "rlj.spec.evaluator.replica", check=False)
    assert result.returncode != 0
    assert 'field "replica" does not exist' in result.stderr

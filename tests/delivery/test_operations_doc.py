"""docs/operations.md: its manifests are valid, and the names it tells people to type are the real ones."""

from __future__ import annotations

import re

import yaml
from rlkube import contract
from rlkube.spec import API_GROUP, API_VERSION, KIND

from tests.delivery.chart import DEFAULT, KUBERNETES_VERSIONS, ROOT, find, kubernetes_problems, only, render

DOC = (ROOT / "docs" / "operations.md").read_text()
CONDITION_TYPES = ("Suspended", "TrainReady", "EvalAvailable", "Running", "Restarting", "Complete", "Failed")


def yaml_blocks() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def test_hpa_example_is_valid_and_targets_the_rljob_scale_subresource() -> None:
    (hpa,) = [d for d in yaml_blocks() if d.get("kind") == "HorizontalPodAutoscaler"]
    problems = [p for v in KUBERNETES_VERSIONS if (p := kubernetes_problems(hpa, v))]
    assert not problems, "\n".join(problems)
    target = hpa["spec"]["scaleTargetRef"]
    assert target["apiVersion"] == f"{API_GROUP}/{API_VERSION}"
    assert target["kind"] == KIND
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_every_manifest_in_the_doc_is_valid_kubernetes() -> None:
    blocks = yaml_blocks()
    assert blocks
    for document in blocks:
        problems = [p for v in KUBERNETES_VERSIONS if (p := kubernetes_problems(document, v))]
        assert not problems, "\n".join(problems)


def test_doc_explains_every_condition_type_in_the_troubleshooting_table() -> None:
    table = DOC.split("## Troubleshooting by condition", 1)[1]
    for condition in CONDITION_TYPES:
        assert f"| `{condition}` |" in table, condition
    for reason in ("InvalidSpec", "BackoffLimitExceeded", "DeadlineExceeded"):
        assert f"reason `{reason}`" in table, reason


def test_doc_says_how_to_upgrade_the_crd_that_helm_does_not() -> None:
    assert "kubectl apply --server-side --force-conflicts -f charts/rlkube/crds/" in DOC
    assert "it never upgrades or deletes" in DOC


def test_names_in_the_doc_are_those_the_chart_renders() -> None:
    objects = render(DEFAULT)
    deployment = only(objects, "Deployment")["metadata"]["name"]
    (service,) = [s["metadata"]["name"] for s in find(objects, "Service")]
    assert f"deployment/{deployment}" in DOC
    assert f"service/{service}" in DOC
    assert f":{contract.OPERATOR_METRICS_PORT}/healthz" in DOC
    assert contract.LABEL_JOB in DOC
    assert contract.RUN_DIR in DOC


def test_doc_lists_every_operator_setting_the_chart_passes() -> None:
    env = only(render(DEFAULT), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    for name in (e["name"] for e in env):
        assert f"`{name}`" in DOC, f"{name} is set by the chart but not in docs/operations.md"

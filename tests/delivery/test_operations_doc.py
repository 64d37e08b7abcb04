"""docs/operations.md: its manifests are valid, and the names it tells people to type are the real ones."""

from __future__ import annotations

import re

import yaml
from rlkube import contract
from rlkube.spec import API_GROUP, API_VERSION, KIND, WeightStrategy
from rlkube_operator.reconcile import EventReason
from rlkube_operator.settings import ENV_VARS
from rlkube_operator.status import ConditionType, Reason

from tests.delivery.chart import DEFAULT, KUBERNETES_VERSIONS, ROOT, find, kubernetes_problems, only, render

DOC = (ROOT / "docs" / "operations.md").read_text()
TROUBLESHOOTING = DOC.split("## Troubleshooting by condition", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table that starts with ``header``."""
    lines = text.split(header, 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def ticked(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


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


def test_troubleshooting_table_has_exactly_the_operators_condition_types_in_order() -> None:
    rows = table_rows(TROUBLESHOOTING, "| type | True means | reasons | what to do |")
    assert [row[0] for row in rows] == [f"`{c.value}`" for c in ConditionType]


def test_every_reason_the_operator_sets_is_documented_and_every_documented_reason_exists() -> None:
    rows = table_rows(TROUBLESHOOTING, "| type | True means | reasons | what to do |")
    in_table = set().union(*(ticked(row[2]) for row in rows))
    operator = {r.value for r in Reason}
    assert in_table == operator, f"undocumented: {operator - in_table}; unknown: {in_table - operator}"
    mentioned = set(re.findall(r"reason `(\w+)`", DOC))
    assert mentioned <= operator | {e.value for e in EventReason}, mentioned - operator


def test_every_event_reason_the_operator_posts_is_documented() -> None:
    rows = table_rows(TROUBLESHOOTING, "| reason | type | when |")
    assert {row[0].strip("`") for row in rows} == {e.value for e in EventReason}


def test_every_operator_variable_named_in_the_doc_is_one() -> None:
    known = set(ENV_VARS) | {var.name for var in contract.ENV_CONTRACT}
    named = set(re.findall(r"\bRLKUBE_[A-Z_]+\b", DOC))
    assert named <= known, f"not operator settings or env contract names: {sorted(named - known)}"


def test_pod_security_table_covers_every_weight_strategy() -> None:
    rows = table_rows(DOC, "| strategy | eval pods' weight buffer | Pod Security level |")
    assert set().union(*(ticked(row[0]) for row in rows)) == {s.value for s in WeightStrategy}


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

"""kubectl validates against the emulator as against a real API server: no ``--validate=false``.

The emulator publishes OpenAPI v3 (``/openapi/v3``), so kubectl's default ``--validate=strict``
asks the server to decode strictly and a typo is refused by the server, naming the field;
``kubectl explain`` reads the RLJob schema from the same documents. Pods and StatefulSets are
checked as the API server checks them (labels, quantities, requests within limits).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from tests.operator.conftest import Kubectl
from tests.operator.harness import ROOT
from tests.operator.manifests import job_document

EXAMPLE = ROOT / "examples" / "rljob.yaml"


def apply(k: Kubectl, document: dict[str, Any] | str, *extra: str) -> Any:
    """``kubectl apply`` exactly as a user types it: kubectl's default validation."""
    text = document if isinstance(document, str) else yaml.safe_dump(document)
    return k("apply", *extra, "-f", "-", input=text, check=False)


def test_the_example_applies_with_kubectls_default_validation(k: Kubectl) -> None:
    result = k("apply", "-f", str(EXAMPLE), check=False)
    assert result.returncode == 0, result.stderr
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    assert k.get("rlj", name) is not None


def test_a_typo_in_a_new_job_is_refused_naming_the_field(k: Kubectl) -> None:
    document = job_document("typo", evaluator={"replica": 3})
    result = apply(k, document)
    assert result.returncode != 0
    assert 'strict decoding error: unknown field "spec.evaluator.replica"' in result.stderr
    assert k.get("rlj", "typo") is None


def test_a_typo_in_an_update_is_refused_and_the_job_is_unchanged(k: Kubectl) -> None:
    document = job_document("edited")
    assert apply(k, document).returncode == 0
    before = k.get("rlj", "edited")
    changed = copy.deepcopy(document)
    changed["spec"]["evaluator"]["replica"] = 3
    result = apply(k, changed)
    assert 'unknown field "spec.evaluator.replica"' in result.stderr
    after = k.get("rlj", "edited")
    assert before is not None
    assert after is not None
    assert after["spec"] == before["spec"]


def test_server_side_apply_is_strict_too(k: Kubectl) -> None:
    result = apply(k, job_document("ssa", train={"maxEpoch": 3}), "--server-side")
    assert result.returncode != 0
    assert 'unknown field "spec.train.maxEpoch"' in result.stderr


def test_without_strict_validation_the_unknown_field_is_pruned(k: Kubectl) -> None:
    result = apply(k, job_document("lenient", evaluator={"replica": 3}), "--validate=false")
    assert result.returncode == 0, result.stderr
    job = k.get("rlj", "lenient")
    assert job is not None
    assert "replica" not in job["spec"]["evaluator"]


def test_explain_describes_the_rljob_spec_from_the_servers_schema(k: Kubectl) -> None:
    spec = k("explain", "rlj.spec").stdout
    assert "KIND:       RLJob" in spec
    assert "VERSION:    v1alpha1" in spec
    for field in ("engine", "env", "evaluator", "trainer", "scheduling", "runPolicy"):
        assert f"  {field}\t<" in spec, field
    gang = k("explain", "rlj.spec.scheduling.gang").stdout
    assert "ENUM:" in gang
    assert "coscheduling" in gang


def test_explain_of_an_unknown_field_fails_as_kubectl_does(k: Kubectl) -> None:
    result = k("explain", "rlj.spec.evaluator.replica", check=False)
    assert result.returncode != 0
    assert 'field "replica" does not exist' in result.stderr


def statefulset(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "busybox", **container}]},
            },
        },
    }


def test_a_valid_statefulset_applies(k: Kubectl) -> None:
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    result = apply(k, statefulset(resources=resources))
    assert result.returncode == 0, result.stderr


def test_a_request_above_its_limit_is_invalid(k: Kubectl) -> None:
    result = apply(k, statefulset(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}))
    assert result.returncode != 0
    assert 'The StatefulSet "web" is invalid' in result.stderr
    assert "spec.template.spec.containers[0].resources.requests" in result.stderr
    assert "must be less than or equal to cpu limit of 1500m" in result.stderr


def test_a_malformed_quantity_is_invalid(k: Kubectl) -> None:
    result = apply(k, statefulset(resources={"limits": {"memory": "lots"}}))
    assert result.returncode != 0
    assert "resources.limits[memory]" in result.stderr
    assert "quantities must match the regular expression" in result.stderr


def test_a_bad_label_and_a_selector_that_misses_the_template_are_invalid(k: Kubectl) -> None:
    document = statefulset()
    document["spec"]["template"]["metadata"]["labels"] = {"app": "other", "team": "rl team"}
    result = apply(k, document)
    assert result.returncode != 0
    assert "spec.template.metadata.labels" in result.stderr
    assert '"rl team"' in result.stderr
    assert "`selector` does not match template `labels`" in result.stderr


def test_openapi_index_lists_a_document_per_group_version(k: Kubectl) -> None:
    index = json.loads(k("get", "--raw", "/openapi/v3").stdout)
    assert {"api/v1", "apis/apps/v1", "apis/rlkube.io/v1alpha1"} <= set(index["paths"])
    url = index["paths"]["apis/rlkube.io/v1alpha1"]["serverRelativeURL"]
    document = json.loads(k("get", "--raw", url).stdout)
    (rljob,) = [
        s
        for s in document["components"]["schemas"].values()
        if {"group": "rlkube.io", "version": "v1alpha1", "kind": "RLJob"}
        in s.get("x-kubernetes-group-version-kind", [])
    ]
    assert "scheduling" in rljob["properties"]["spec"]["properties"]


# Built-in kinds: Kubernetes' own schemas, served and enforced --------------------------------------


def test_explain_describes_a_statefulset_spec_from_kubernetes_own_schema(k: Kubectl) -> None:
    spec = k("explain", "sts.spec").stdout
    assert "GROUP:      apps" in spec
    assert "KIND:       StatefulSet" in spec
    assert "VERSION:    v1" in spec
    assert "A StatefulSetSpec is the specification of a StatefulSet." in spec
    for field in ("podManagementPolicy", "replicas", "selector", "serviceName", "template", "updateStrategy"):
        assert f"  {field}\t<" in spec, field
    resources = k("explain", "sts.spec.template.spec.containers.resources.limits").stdout
    assert "map[string]Quantity" in resources


@pytest.mark.parametrize(
    ("resource", "kind", "field"),
    [
        ("pod.spec.containers", "Pod", "terminationMessagePath"),
        ("service.spec", "Service", "clusterIP"),
        ("configmap", "ConfigMap", "binaryData"),
        ("secret", "Secret", "stringData"),
        ("networkpolicy.spec", "NetworkPolicy", "policyTypes"),
        ("pdb.spec", "PodDisruptionBudget", "minAvailable"),
        ("serviceaccount", "ServiceAccount", "automountServiceAccountToken"),
    ],
)
def test_explain_works_for_every_kind_the_operator_creates(
    k: Kubectl, resource: str, kind: str, field: str
) -> None:
    result = k("explain", resource, check=False)
    assert result.returncode == 0, result.stderr
    assert f"KIND:       {kind}" in result.stdout
    assert f"  {field}\t<" in result.stdout


def test_a_typo_in_a_statefulset_is_refused_naming_the_field(k: Kubectl) -> None:
    document = statefulset(imagePullPolic="Always")
    result = apply(k, document)
    assert result.returncode != 0
    assert (
        'StatefulSet in version "v1" cannot be handled as a StatefulSet: strict decoding error: '
        'unknown field "spec.template.spec.containers[0].imagePullPolic"'
    ) in result.stderr
    assert k.get("statefulset", "web") is None


def test_a_typo_in_a_statefulset_update_is_refused_and_it_is_unchanged(k: Kubectl) -> None:
    assert apply(k, statefulset()).returncode == 0
    before = k.get("statefulset", "web")
    changed = statefulset()
    changed["spec"]["replica"] = 3
    result = apply(k, changed)
    assert result.returncode != 0
    assert 'unknown field "spec.replica"' in result.stderr
    after = k.get("statefulset", "web")
    assert before is not None
    assert after is not None
    assert after["spec"] == before["spec"]


def test_a_value_of_the_wrong_type_in_a_statefulset_is_refused_as_the_decoder_refuses_it(k: Kubectl) -> None:
    document = statefulset(ports=[{"containerPort": "http"}])
    result = apply(k, document, "--validate=false")
    assert result.returncode != 0
    assert (
        "json: cannot unmarshal string into Go struct field "
        "ContainerPort.spec.template.spec.containers.ports.containerPort of type int32"
    ) in result.stderr
    assert k.get("statefulset", "web") is None


def test_server_side_apply_of_a_built_in_kind_is_strict_too(k: Kubectl) -> None:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "datas": {"a": "b"}}
    result = apply(k, configmap, "--server-side")
    assert result.returncode != 0
    assert 'unknown field "datas"' in result.stderr
    assert k.get("configmap", "cm") is None


def test_without_strict_validation_an_unknown_field_of_a_built_in_kind_is_dropped(k: Kubectl) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "protocl": "TCP"}]},
    }
    result = apply(k, service, "--validate=false")
    assert result.returncode == 0, result.stderr
    stored = k.get("service", "svc")
    assert stored is not None
    assert stored["spec"]["ports"] == [{"port": 80}]


def test_everything_the_operator_renders_applies_strictly_and_keeps_every_field(k: Kubectl) -> None:
    import subprocess
    import sys

    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlkube.cli",
            "render",
            str(EXAMPLE),
            "--set",
            f"metadata.namespace={k.namespace}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    assert {o["kind"] for o in objects} >= {"StatefulSet", "Service", "ConfigMap"}
    result = k("apply", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr
    for obj in objects:
        stored = k.get(obj["kind"].lower(), obj["metadata"]["name"])
        assert stored is not None, obj["kind"]
        for section in ("spec", "data"):
            if section in obj:
                assert contains(stored[section], obj[section]), (obj["kind"], section)


def contains(stored: Any, rendered: Any) -> bool:
    """Whether every field of ``rendered`` is in ``stored`` with the same value (defaults may be added)."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(
            key in stored and contains(stored[key], value) for key, value in rendered.items()
        )
    if isinstance(rendered, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(rendered)
            and all(contains(s, r) for s, r in zip(stored, rendered, strict=True))
        )
    return bool(stored == rendered)

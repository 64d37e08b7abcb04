"""The Helm chart lints clean, renders valid Kubernetes objects, and deploys the operator as agreed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils
from rlkube import contract
from rlkube.spec import EvaluatorSpec, TrainerSpec

from tests.delivery.chart import (
    CHART,
    DEFAULT,
    EVERYTHING,
    GPU,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    NAMESPACED,
    RELEASE,
    VALUE_SETS,
    ValueSet,
    default_pod_settings,
    find,
    has_schema,
    helm,
    kubernetes_problems,
    only,
    operator_container,
    operator_env,
    render,
    template_args,
)

ids = [v.name for v in VALUE_SETS]


@pytest.mark.parametrize("values", VALUE_SETS, ids=ids)
def test_helm_lint_strict_is_clean(values: ValueSet) -> None:
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values.helm_args(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout, result.stdout
    assert "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("values", VALUE_SETS, ids=ids)
def test_every_rendered_object_is_valid_for_kubernetes_1_29_to_1_35(values: ValueSet) -> None:
    problems: list[str] = []
    unchecked: set[str] = set()
    for version in KUBERNETES_VERSIONS:
        for document in render(values, f"{version}.0"):
            if not has_schema(document, version):
                unchecked.add(f"{document['apiVersion']}/{document['kind']}")
                continue
            problem = kubernetes_problems(document, version)
            if problem:
                problems.append(problem)
    assert not problems, "\n".join(problems)
    # Only the Prometheus Operator's ServiceMonitor has no built-in schema.
    assert unchecked <= {"monitoring.coreos.com/v1/ServiceMonitor"}, unchecked


def test_installed_kubernetes_validate_has_schemas_for_every_version_tested() -> None:
    # validate() silently falls back to the newest older schema; make sure none is missing.
    available = {utils.major_minor(v) for v in utils.all_versions()}
    assert set(KUBERNETES_VERSIONS) <= available, sorted(available)


def test_chart_refuses_kubernetes_older_than_1_29() -> None:
    result = helm(*template_args(DEFAULT, kube_version="1.28.0"), check=False)
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr, result.stderr


def test_default_install_renders_the_operator_and_its_plumbing() -> None:
    kinds = sorted(o["kind"] for o in render(DEFAULT))
    expected = ["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding"]
    expected += ["Role", "RoleBinding", "PodDisruptionBudget"]
    assert kinds == sorted([*expected, "Service", "Deployment", "NetworkPolicy"])
    for document in render(DEFAULT):
        if document["kind"] in (
            "ServiceAccount",
            "Service",
            "Deployment",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
        ):
            assert document["metadata"]["namespace"] == NAMESPACE


def test_operator_runs_two_replicas_rolled_one_at_a_time_with_a_disruption_budget() -> None:
    for values in VALUE_SETS:
        objects = render(values)
        deployment = only(objects, "Deployment")
        assert deployment["spec"]["replicas"] == 2
        assert deployment["spec"]["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
        budget = only(objects, "PodDisruptionBudget")
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]


def test_operator_replicas_elect_a_leader_through_a_lease_they_may_write_in_their_namespace_only() -> None:
    from rlkube_operator.rbac import LEASE_RULES

    for values in VALUE_SETS:
        objects = render(values)
        env = {e["name"]: e for e in operator_container(objects)["env"]}
        assert env["RLKUBE_LEADER_ELECTION_LEASE"]["value"]
        assert env["RLKUBE_LEASE_DURATION"]["value"] == "10"
        leases = [r for r in find(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]
        assert len(leases) == 1, values
        (role,) = leases
        assert role["metadata"]["namespace"] == NAMESPACE
        assert role["rules"] == [rule.as_manifest() for rule in LEASE_RULES]
        (binding,) = find(objects, "RoleBinding", role["metadata"]["name"])
        assert binding["metadata"]["namespace"] == NAMESPACE
        (subject,) = binding["subjects"]
        assert (
            subject["name"] == only(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        )
        # Nowhere else: a ClusterRole granting leases could take over other controllers' Leases.
        for cluster_role in (o for o in objects if o["kind"] == "ClusterRole"):
            assert all("leases" not in rule.get("resources", []) for rule in cluster_role["rules"])


def test_one_operator_replica_has_no_disruption_budget() -> None:
    objects = render(ValueSet("single", sets=("operator.replicas=1",)))
    assert only(objects, "Deployment")["spec"]["replicas"] == 1
    assert not find(objects, "PodDisruptionBudget")


def test_operator_runs_rlkube_operator_under_the_images_entrypoint() -> None:
    container = operator_container(render(DEFAULT))
    assert "command" not in container, "the image's entrypoint (tini -- rlkube) must stay"
    assert container["args"] == ["operator"]


def test_namespaced_mode_tells_the_operator_each_watched_namespace() -> None:
    objects = render(NAMESPACED)
    assert operator_container(objects)["args"] == ["operator"]
    assert operator_env(objects)["RLKUBE_WATCH_NAMESPACES"] == "team-a,team-b"
    assert operator_env(render(DEFAULT))["RLKUBE_WATCH_NAMESPACES"] == ""


def test_extra_operator_args_come_after_the_charts_own() -> None:
    assert operator_container(render(EVERYTHING))["args"] == ["operator", "--verbose"]


def test_operator_endpoint_port_is_the_contract_port_and_probes_use_it() -> None:
    container = operator_container(render(DEFAULT))
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": contract.OPERATOR_METRICS_PORT, "protocol": "TCP"}
    assert operator_env(render(DEFAULT))["RLKUBE_METRICS_PORT"] == str(contract.OPERATOR_METRICS_PORT)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    service = only(render(DEFAULT), "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert (
        service["spec"]["selector"] == only(render(DEFAULT), "Deployment")["spec"]["selector"]["matchLabels"]
    )


def test_operator_runs_as_non_root_with_a_read_only_root_and_no_capabilities() -> None:
    pod = only(render(DEFAULT), "Deployment")["spec"]["template"]["spec"]
    container = operator_container(render(DEFAULT))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == contract.IMAGE_USER_ID  # the Dockerfile's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]


def test_operator_settings_reach_the_operator_as_env() -> None:
    env = operator_env(render(DEFAULT))
    assert env["RLKUBE_OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["RLKUBE_DEFAULT_IMAGE"] == "rlkube:0.1.0"  # the operator's own image
    assert env["RLKUBE_NETWORK_POLICY"] == "true"  # on by default
    assert env["RLKUBE_LOG_LEVEL"] == "info"
    labels = json.loads(env["RLKUBE_OPERATOR_POD_LABELS"])
    assert labels == only(render(DEFAULT), "Deployment")["spec"]["selector"]["matchLabels"]
    everything = operator_env(render(EVERYTHING))
    assert everything["RLKUBE_NETWORK_POLICY"] == "true"
    assert everything["RLKUBE_LOG_LEVEL"] == "debug"
    assert everything["RLKUBE_STATUS_INTERVAL"] == "10"


def test_default_pod_settings_are_valid_trainer_and_evaluator_sections_of_an_rljob() -> None:
    for values in VALUE_SETS:
        settings = default_pod_settings(render(values))
        assert set(settings) == {"trainer", "evaluator"}
        TrainerSpec.model_validate(settings["trainer"])
        EvaluatorSpec.model_validate(settings["evaluator"])
        # Empty values are left out, so they never override an RLJob's own settings.
        for role in settings.values():
            assert all(value not in ("", [], {}, None) for value in role.values()), role


def test_gpu_values_ask_one_gpu_per_train_pod_and_tolerate_gpu_taints() -> None:
    settings = default_pod_settings(render(GPU))
    trainer = TrainerSpec.model_validate(settings["trainer"])
    assert trainer.gpus() == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in trainer.tolerations
    assert "nvidia.com/gpu" not in settings["evaluator"]["resources"].get("limits", {})
    env = operator_env(render(GPU))
    assert env["RLKUBE_DEFAULT_IMAGE"].endswith("-cuda")
    assert (
        only(render(GPU), "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
        == "rlkube:0.1.0"
    )


def test_gpu_values_image_follows_the_charts_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    gpu_values = yaml.safe_load((CHART / "values-gpu.yaml").read_text())
    assert gpu_values["jobDefaults"]["image"].endswith(f":{app_version}-cuda")


def test_digest_replaces_the_tag_in_the_image_reference() -> None:
    image = operator_container(render(EVERYTHING))["image"]
    assert image == "rlkube@sha256:" + "0" * 64


def test_service_monitor_scrapes_the_metrics_port_of_the_metrics_service() -> None:
    objects = render(EVERYTHING)
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_service_monitor_needs_the_metrics_service() -> None:
    values = ValueSet(
        "monitor-no-service", sets=("metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false")
    )
    result = helm(*template_args(values), check=False)
    assert result.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


def test_network_policy_admits_only_the_metrics_port_of_the_operator() -> None:
    assert not find(render(ValueSet("no-netpol", sets=("networkPolicy.enabled=false",))), "NetworkPolicy")
    assert find(render(DEFAULT), "NetworkPolicy")  # on by default
    objects = render(EVERYTHING)
    policy = only(objects, "NetworkPolicy")
    deployment = only(objects, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def test_all_objects_carry_the_standard_labels() -> None:
    for document in render(EVERYTHING):
        labels = document["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/part-of"] == "rlkube"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def _render_notes(tmp_path: Path, values: ValueSet) -> str:
    """NOTES.txt is not printed by `helm template`; render it as a ConfigMap from a copy of the chart."""
    chart = tmp_path / "rlkube"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes_test.tpl").write_text('{{- define "test.notes" }}' + notes + "{{- end }}")
    (chart / "templates" / "notes-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ include "test.notes" . | quote }}\n'
    )
    out = helm(*template_args(values, chart=chart), "--show-only", "templates/notes-test.yaml").stdout
    return yaml.safe_load(out)["data"]["notes"]


def test_notes_tell_the_next_commands(tmp_path: Path) -> None:
    notes = _render_notes(tmp_path, DEFAULT)
    assert f"kubectl -n {NAMESPACE} rollout status deployment/rlkube-operator" in notes
    assert "kubectl apply -f examples/rljob-kind.yaml" in notes
    assert "kubectl wait --for=condition=Complete rlj/cartpole-kind" in notes
    assert "kubectl scale rlj/cartpole-kind --replicas=4" in notes
    assert "kubectl apply --server-side --force-conflicts -f charts/rlkube/crds/" in notes
    assert "all namespaces" in notes
    namespaced = _render_notes(tmp_path / "ns", NAMESPACED)
    assert "the namespaces team-a, team-b" in namespaced
    assert "kubectl -n team-a apply -f examples/rljob-kind.yaml" in namespaced

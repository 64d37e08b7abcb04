"""The chart's monitoring of RLJob pods: a PodMonitor and a Grafana dashboard, both opt-in."""

from __future__ import annotations

import json

import pytest
from rlkube import contract as c
from rlkube.spec import parse_job
from rlkube_operator import render as r
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB
from tests.delivery.chart import (
    CHART,
    DEFAULT,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    ValueSet,
    find,
    helm,
    kubernetes_problems,
    only,
    render,
)

MONITORED = ValueSet(
    "monitored",
    sets=(
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.labels.release=prometheus",
        "metrics.dashboards.enabled=true",
        "metrics.dashboards.namespace=monitoring",
    ),
    set_strings=("metrics.dashboards.annotations.grafana_folder=RL",),
)
MONITORED_NAMESPACES = ValueSet(
    "monitored-namespaces", sets=("metrics.podMonitor.enabled=true", "watchNamespaces={team-a,team-b}")
)


def pod_templates() -> list[dict]:
    objects = r.render(parse_job(MINIMAL_JOB), RenderSettings())
    return [o["spec"]["template"] for o in objects if o["kind"] == "StatefulSet"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    for term in selector.get("matchExpressions", []):
        key, op = term["key"], term["operator"]
        if op == "Exists" and key not in labels:
            return False
        if op == "In" and labels.get(key) not in term["values"]:
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_monitoring_objects_are_off_by_default() -> None:
    objects = render(DEFAULT)
    assert not find(objects, "PodMonitor")
    assert not [o for o in find(objects, "ConfigMap") if "dashboards" in o["metadata"]["name"]]


def test_the_pod_monitor_scrapes_the_metrics_port_of_every_train_and_eval_pod() -> None:
    monitor = only(render(MONITORED), "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    spec = monitor["spec"]
    templates = pod_templates()
    assert len(templates) == 2
    for template in templates:
        assert selects(spec["selector"], template["metadata"]["labels"]), template["metadata"]["labels"]
        (container,) = template["spec"]["containers"]
        assert r.METRICS_PORT_NAME in {p["name"] for p in container["ports"]}
    assert not selects(spec["selector"], {"app.kubernetes.io/component": "operator"})
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == r.METRICS_PORT_NAME
    assert endpoint["path"] == c.METRICS_PATH
    targets = {relabel["targetLabel"] for relabel in endpoint["relabelings"]}
    assert {"rljob", "role"} <= targets  # the dashboard's variables


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [(MONITORED, {"any": True}), (MONITORED_NAMESPACES, {"matchNames": ["team-a", "team-b"]})],
    ids=["all-namespaces", "watched-namespaces"],
)
def test_the_pod_monitor_looks_where_the_operator_watches(values: ValueSet, namespaces: dict) -> None:
    assert only(render(values), "PodMonitor")["spec"]["namespaceSelector"] == namespaces


def test_the_dashboard_config_map_carries_the_charts_dashboard_for_grafanas_sidecar() -> None:
    (config_map,) = [o for o in find(render(MONITORED), "ConfigMap") if "dashboards" in o["metadata"]["name"]]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "RL"}
    assert config_map["metadata"]["namespace"] == "monitoring"
    shipped = json.loads((CHART / "dashboards" / "rlkube.json").read_text())
    assert json.loads(config_map["data"]["rlkube.json"]) == shipped
    for version in (KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]):
        assert kubernetes_problems(config_map, version) is None


def test_helm_lint_strict_is_clean_with_monitoring_on() -> None:
    result = helm(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *MONITORED.helm_args(), check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout, result.stdout

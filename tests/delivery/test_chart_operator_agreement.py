"""The chart's operator Deployment and the operator agree: env names and values, arguments, port and paths.

The operator is the source of truth. For several ways of installing the chart, the env the
Deployment sets is fed to the operator's own settings loader and its arguments to the operator's
own argument parser, so a name, value or flag the operator does not know fails here, not in a
crash-looping pod.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from rlkube.cli import parse_args
from rlkube.spec import parse_job
from rlkube_operator import metrics
from rlkube_operator.cli import parse_operator_args
from rlkube_operator.defaults import DEFAULTABLE_KEYS, parse_pod_defaults
from rlkube_operator.render import render, render_network_policy
from rlkube_operator.settings import ENV_VARS, OperatorSettings, load_settings

from tests.delivery.chart import (
    CHART,
    DEFAULT,
    EVERYTHING,
    GPU,
    NAMESPACE,
    NAMESPACED,
    ROOT,
    VALUE_SETS,
    ValueSet,
    find,
    kubernetes_problems,
    only,
    operator_container,
)
from tests.delivery.chart import render as helm_render

CUSTOM = ValueSet(
    "custom",
    sets=(
        "operator.metricsPort=9100",
        "metrics.service.port=9100",
        "networkPolicy.enabled=true",
        "jobDefaults.image=registry.example/rl:7",
        "jobDefaults.evaluator.nodeSelector.pool=cpu",
        "operator.extraArgs={--verbose}",
    ),
)
SETS = (*VALUE_SETS, CUSTOM)
ids = [v.name for v in SETS]


def deployment_env(objects: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The operator container's environment as the kubelet would give it (downward API filled in)."""
    env: dict[str, str] = {}
    for entry in operator_container(objects)["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        field = entry["valueFrom"]["fieldRef"]["fieldPath"]
        downward = {"metadata.namespace": NAMESPACE, "metadata.name": "rlkube-operator-5d9c7-x2x4q"}
        assert field in downward, f"{entry['name']}: unexpected source {entry['valueFrom']}"
        env[entry["name"]] = downward[field]
    return env


def values_of(values: ValueSet) -> dict[str, Any]:
    """The chart's values for a value set: values.yaml, then its files (enough for the keys used here)."""
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in values.files:
        _deep_update(merged, yaml.safe_load((CHART / path).read_text()))
    return merged


def _deep_update(base: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = value


def settings_for(values: ValueSet) -> OperatorSettings:
    return load_settings(deployment_env(helm_render(values)))


@pytest.mark.parametrize("values", SETS, ids=ids)
def test_every_variable_the_chart_sets_is_an_operator_setting_that_parses(values: ValueSet) -> None:
    env = deployment_env(helm_render(values))
    unknown = sorted(set(env) - set(ENV_VARS))
    assert not unknown, f"the chart sets variables the operator does not read: {unknown}"
    load_settings(env)  # raises SettingsError naming every bad value


@pytest.mark.parametrize("values", SETS, ids=ids)
def test_the_operator_accepts_the_charts_arguments(values: ValueSet) -> None:
    args = operator_container(helm_render(values))["args"]
    command = parse_args(args)
    assert command.command == "operator"
    options = parse_operator_args(command.kopf_args)
    assert not options.namespace, "namespaces reach the operator as RLKUBE_WATCH_NAMESPACES only"
    assert not options.all_namespaces


def test_the_argument_check_would_catch_a_flag_the_operator_does_not_have() -> None:
    with pytest.raises(SystemExit):
        parse_operator_args(parse_args(["operator", "--standalone"]).kopf_args)


@pytest.mark.parametrize("values", [DEFAULT, NAMESPACED, CUSTOM], ids=["default", "namespaced", "custom"])
def test_the_operator_serves_the_namespaces_port_and_log_level_the_chart_asks_for(values: ValueSet) -> None:
    settings = settings_for(values)
    chart = values_of(values)
    objects = helm_render(values)
    namespaces = {"namespaced": ("team-a", "team-b")}.get(values.name, ())
    assert settings.namespaces == namespaces
    assert settings.log_level == chart["operator"]["logLevel"]
    (port,) = operator_container(objects)["ports"]
    expected_port = 9100 if values is CUSTOM else chart["operator"]["metricsPort"]
    assert settings.metrics_port == port["containerPort"] == expected_port
    (service,) = find(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]


@pytest.mark.asyncio
async def test_the_probes_and_the_service_monitor_ask_for_paths_the_operator_serves() -> None:
    container = operator_container(helm_render(DEFAULT))
    monitor = only(helm_render(EVERYTHING), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    async with TestClient(TestServer(metrics.build_app())) as client:
        for probe in ("livenessProbe", "readinessProbe"):
            response = await client.get(container[probe]["httpGet"]["path"])
            assert response.status == 200, probe
        response = await client.get(endpoint["path"])
        assert response.status == 200
        assert "rlkube_operator_reconciles_total" in await response.text()


@pytest.mark.parametrize("values", SETS, ids=ids)
def test_per_job_network_policies_admit_the_operator_pod_the_chart_runs(values: ValueSet) -> None:
    settings = settings_for(values)
    objects = helm_render(values)
    assert settings.render.network_policy == bool(find(objects, "NetworkPolicy"))
    policy = render_network_policy(
        parse_job(yaml.safe_load((ROOT / "examples/rljob-kind.yaml").read_text())), settings.render
    )
    operator_peer = policy["spec"]["ingress"][1]["from"][0]
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert operator_peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert operator_peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}


@pytest.mark.parametrize("values", [DEFAULT, GPU], ids=["default", "gpu"])
def test_job_defaults_reach_the_operator_as_given(values: ValueSet) -> None:
    settings = settings_for(values)
    job_defaults = values_of(values)["jobDefaults"]
    # What the chart passes: each role's keys, without the empty ones.
    given = {role: {k: v for k, v in job_defaults[role].items() if v} for role in ("trainer", "evaluator")}
    assert settings.render.pod_defaults == parse_pod_defaults(given)
    image = job_defaults["image"] or operator_container(helm_render(values))["image"]
    assert settings.render.default_image == image


def test_set_job_defaults_reach_the_operator() -> None:
    settings = settings_for(CUSTOM)
    assert settings.render.default_image == "registry.example/rl:7"
    assert settings.render.pod_defaults.evaluator.node_selector == {"pool": "cpu"}
    assert settings.render.pod_defaults.trainer.node_selector == {}


def test_gpu_values_make_a_plain_job_a_gpu_job_and_the_jobs_own_settings_win() -> None:
    settings = settings_for(GPU)
    document = yaml.safe_load((ROOT / "examples/rljob-kind.yaml").read_text())
    document["metadata"]["namespace"] = "team-a"
    del document["spec"]["trainer"]["backend"]  # auto: nccl when the pods get GPUs
    objects = render(parse_job(document), settings.render)
    train = next(
        o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-train")
    )
    pod = train["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The job asks for cpu and memory itself; the GPU comes from the chart's defaults.
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "memory": "2Gi"},
        "requests": {"cpu": "500m", "memory": "1Gi"},
    }
    assert container["image"].endswith("-cuda")
    assert {"name": "RLKUBE_BACKEND", "value": "nccl"} in container["env"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    problems = [p for o in objects if (p := kubernetes_problems(o, "1.29"))]
    assert not problems, problems


def test_the_charts_job_defaults_keys_are_the_operators() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["jobDefaults"]["properties"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["jobDefaults"]
    for role in ("trainer", "evaluator"):
        assert sorted(schema[role]["properties"]) == sorted(DEFAULTABLE_KEYS), role
        assert sorted(values[role]) == sorted(DEFAULTABLE_KEYS), role

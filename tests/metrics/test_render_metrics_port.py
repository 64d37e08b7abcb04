"""Train and eval pod templates declare the metrics port and tell the pod about it."""

from __future__ import annotations

import pytest
from rlkube import contract as c
from rlkube.spec import parse_job
from rlkube_operator import render as r
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB

SETTINGS = RenderSettings()


@pytest.mark.parametrize("kind", ["train", "eval"])
def test_every_pod_template_declares_the_metrics_port_and_sets_it_in_the_env(kind: str) -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in r.render(parse_job(MINIMAL_JOB), SETTINGS)}
    (container,) = objects["StatefulSet", f"cartpole-{kind}"]["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p for p in container["ports"]}
    assert ports[r.METRICS_PORT_NAME] == {
        "name": "metrics",
        "containerPort": c.METRICS_PORT,
        "protocol": "TCP",
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RLKUBE_METRICS_PORT"] == str(c.METRICS_PORT)


def test_services_do_not_carry_the_metrics_port() -> None:
    # Prometheus scrapes pods (the chart's PodMonitor), so no Service needs it.
    for obj in r.render(parse_job(MINIMAL_JOB), SETTINGS):
        if obj["kind"] == "Service":
            assert c.METRICS_PORT not in {p["port"] for p in obj["spec"].get("ports", [])}


def test_the_cluster_in_a_box_gives_every_pod_its_own_metrics_port() -> None:
    from rlkube_devcluster.kubelet.podnet import JobPorts, cluster_addresses

    ports = JobPorts(1, 2)
    rendered = {"RLKUBE_METRICS_PORT": str(c.METRICS_PORT)}
    pods = [("train", "0"), ("eval", "0"), ("eval", "1")]
    got = [
        cluster_addresses(
            {**rendered, "RLKUBE_ROLE": role, "RLKUBE_REPLICA_INDEX": index},
            job="cp",
            namespace="rl",
            ports=ports,
        )["RLKUBE_METRICS_PORT"]
        for role, index in pods
    ]
    assert len(set(got)) == 3
    again = cluster_addresses(
        {**rendered, "RLKUBE_ROLE": "eval", "RLKUBE_REPLICA_INDEX": "1"},
        job="cp",
        namespace="rl",
        ports=ports,
    )
    assert again["RLKUBE_METRICS_PORT"] == got[2]  # a restarted pod serves where it did

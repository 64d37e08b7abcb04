"""Pods answer grpc.health.v1, and the operator points kubelet's gRPC probes at it."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlkube import contract
from rlkube.contract import Role
from rlkube.health import PodHealth
from rlkube.spec import parse_job
from rlkube_operator.render import render_pod_template
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def test_a_pod_is_alive_at_once_and_ready_when_its_role_says_so() -> None:
    health = PodHealth().serve(0, host="127.0.0.1")
    try:
        assert check(health.port, "") == SERVING
        assert check(health.port, contract.READINESS_SERVICE) == NOT_SERVING
        health.ready()
        assert check(health.port, contract.READINESS_SERVICE) == SERVING
        health.ready(False)
        assert check(health.port, contract.READINESS_SERVICE) == NOT_SERVING
    finally:
        health.close()


def test_a_health_port_that_is_taken_is_not_fatal() -> None:
    first = PodHealth().serve(0, host="127.0.0.1")
    try:
        second = PodHealth().serve(first.port, host="127.0.0.1")
        assert check(first.port, "") == SERVING
        second.close()
    finally:
        first.close()


@pytest.mark.parametrize("role", [Role.TRAIN, Role.EVAL])
def test_every_pod_gets_grpc_startup_liveness_and_readiness_probes(role: Role) -> None:
    template = render_pod_template(parse_job(MINIMAL_JOB), role, RenderSettings(default_image="rlkube:test"))
    container = template["spec"]["containers"][0]
    assert container["livenessProbe"]["grpc"] == {"port": contract.HEALTH_PORT}
    assert container["startupProbe"]["grpc"] == {"port": contract.HEALTH_PORT}
    assert container["readinessProbe"]["grpc"] == {
        "port": contract.HEALTH_PORT,
        "service": contract.READINESS_SERVICE,
    }

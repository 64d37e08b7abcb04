"""Operator settings from the environment, the update classifier, and the CLI entry points."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import yaml
from rlkube._proto import policy_group_pb2 as pb
from rlkube_operator.coordinator import report_from_proto
from rlkube_operator.settings import ENV_VARS, SettingsError, load_settings

from tests.conftest import MINIMAL_JOB


def test_defaults_need_no_environment() -> None:
    settings = load_settings({})
    assert settings.metrics_port == 8080
    assert settings.namespaces == ()
    assert settings.render.gpu_tolerations[0]["key"] == "nvidia.com/gpu"
    assert settings.coordinator_target("j", "ns") == "j-coordinator.ns.svc:50051"


def test_every_variable_is_read() -> None:
    env = {
        "RLKUBE_DEFAULT_IMAGE": "me/rl:2",
        "RLKUBE_IMAGE_PULL_POLICY": "Always",
        "RLKUBE_GPU_TOLERATIONS": "[]",
        "RLKUBE_DEFAULT_NODE_SELECTOR": '{"pool": "rl"}',
        "RLKUBE_DEFAULT_POD_SETTINGS": '{"evaluator": {"resources": {"requests": {"cpu": "250m"}}}}',
        "RLKUBE_TRAIN_GRACE_SECONDS": "10",
        "RLKUBE_EVAL_GRACE_SECONDS": "20",
        "RLKUBE_TRAIN_SHM_SIZE": "1Gi",
        "RLKUBE_NETWORK_POLICY": "true",
        "RLKUBE_OPERATOR_NAMESPACE": "ops",
        "RLKUBE_OPERATOR_POD_LABELS": '{"app": "op"}',
        "RLKUBE_WATCH_NAMESPACES": "a, b",
        "RLKUBE_METRICS_PORT": "9090",
        "RLKUBE_STATUS_INTERVAL": "2.5",
        "RLKUBE_COORDINATOR_TIMEOUT": "1",
        "RLKUBE_COORDINATOR_ADDRESS": "unix:///run/{namespace}.{job}.sock",
        "RLKUBE_WATCH_SERVER_TIMEOUT": "100",
        "RLKUBE_WATCH_CLIENT_TIMEOUT": "120",
        "RLKUBE_API_TIMEOUT": "15",
        "RLKUBE_WORKERS": "4",
        "RLKUBE_LOG_LEVEL": "debug",
        "RLKUBE_FIELD_MANAGER": "me",
        "RLKUBE_LEADER_ELECTION_LEASE": "rlkube-operator",
        "RLKUBE_LEASE_DURATION": "12",
    }
    assert set(env) == set(ENV_VARS)
    s = load_settings(env)
    r = s.render
    assert (r.default_image, r.image_pull_policy, r.gpu_tolerations) == ("me/rl:2", "Always", ())
    assert dict(r.default_node_selector) == {"pool": "rl"}
    assert r.pod_defaults.evaluator.resources.requests == {"cpu": "250m"}
    assert (r.train_grace_seconds, r.eval_grace_seconds, r.train_shm_size) == (10, 20, "1Gi")
    assert r.network_policy
    assert (r.operator_namespace, dict(r.operator_pod_labels)) == ("ops", {"app": "op"})
    assert s.namespaces == ("a", "b")
    assert (s.metrics_port, s.status_interval, s.coordinator_timeout) == (9090, 2.5, 1.0)
    assert s.coordinator_target("j", "n") == "unix:///run/n.j.sock"
    assert (s.watch_server_timeout, s.watch_client_timeout, s.api_timeout, s.workers) == (100, 120, 15.0, 4)
    assert (s.log_level, s.field_manager) == ("debug", "me")
    assert (s.leader_election_lease, s.lease_duration) == ("rlkube-operator", 12)


def test_bad_values_are_all_named_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(
            {
                "RLKUBE_METRICS_PORT": "http",
                "RLKUBE_GPU_TOLERATIONS": "{",
                "RLKUBE_IMAGE_PULL_POLICY": "Sometimes",
                "RLKUBE_NETWORK_POLICY": "maybe",
                "RLKUBE_COORDINATOR_ADDRESS": "{host}:1",
                "RLKUBE_DEFAULT_POD_SETTINGS": '{"trainer": {"replicas": 2}}',
            }
        )
    text = str(caught.value)
    for name in (
        "RLKUBE_METRICS_PORT",
        "RLKUBE_GPU_TOLERATIONS",
        "RLKUBE_IMAGE_PULL_POLICY",
        "RLKUBE_NETWORK_POLICY",
        "RLKUBE_COORDINATOR_ADDRESS",
        "RLKUBE_DEFAULT_POD_SETTINGS: trainer.replicas",
    ):
        assert name in text


def test_a_client_watch_timeout_shorter_than_the_servers_is_refused() -> None:
    with pytest.raises(SettingsError, match="RLKUBE_WATCH_CLIENT_TIMEOUT"):
        load_settings({"RLKUBE_WATCH_SERVER_TIMEOUT": "300", "RLKUBE_WATCH_CLIENT_TIMEOUT": "60"})


def test_only_a_change_of_eval_replicas_counts_as_a_scale() -> None:
    from rlkube_operator.handlers import only_eval_replicas_changed

    assert only_eval_replicas_changed([("change", ("spec", "evaluator", "replicas"), 1, 5)])
    assert only_eval_replicas_changed([("add", ("spec", "evaluator"), None, {"replicas": 5})])
    assert not only_eval_replicas_changed([("change", ("spec", "trainer", "replicas"), 1, 2)])
    assert not only_eval_replicas_changed(
        [
            ("change", ("spec", "evaluator", "replicas"), 1, 5),
            ("change", ("spec", "train", "maxEpochs"), 1, 2),
        ]
    )
    assert not only_eval_replicas_changed([("change", ("spec", "evaluator"), {"replicas": 1}, {"env": []})])
    assert not only_eval_replicas_changed([])


def test_proto_status_becomes_a_report_without_protobuf_types() -> None:
    message = pb.JobStatus(
        phase="Running",
        epoch=3,
        max_epochs=9,
        env_steps=100,
        episodes=0,
        last_return=0.0,
        weight_version=3,
        nodes=[pb.NodeWeights(node_name="n1", version=2, lag=1, workers=3)],
    )
    report = report_from_proto(message)
    assert (report.phase, report.epoch, report.weight_version) == ("Running", 3, 3)
    assert report.last_return is None  # no episode has ended yet
    assert report.nodes[0].lag == 1
    assert report_from_proto(pb.JobStatus(episodes=2, last_return=math.nan)).last_return is None
    assert report_from_proto(pb.JobStatus()).phase == "Starting"


def test_unreachable_coordinator_gives_no_report(tmp_path: Path) -> None:
    from rlkube_operator.coordinator import get_status

    assert get_status(f"unix://{tmp_path}/none.sock", timeout=0.2) is None


def test_render_and_crd_commands_print_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlkube_operator.cli import crd_command, render_command

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(MINIMAL_JOB))
    assert render_command(argparse.Namespace(job=job, overrides=["spec.evaluator.replicas=3"])) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objects][-1] == "StatefulSet"
    assert objects[-1]["spec"]["replicas"] == 3
    assert crd_command(argparse.Namespace()) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "CustomResourceDefinition"


def test_operator_command_refuses_bad_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlkube_operator.cli import operator_command

    monkeypatch.setenv("RLKUBE_WORKERS", "none")
    assert operator_command(argparse.Namespace(kopf_args=[])) == 2
    assert "RLKUBE_WORKERS" in capsys.readouterr().err


def test_rlkube_operator_passes_its_options_to_the_operators_parser() -> None:
    from rlkube.cli import parse_args
    from rlkube_operator.cli import parse_operator_args

    for argv in (["operator", "-A", "--verbose"], ["operator", "--verbose", "-A"]):
        options = parse_operator_args(parse_args(argv).kopf_args)
        assert options.all_namespaces
        assert options.verbose
    options = parse_operator_args(parse_args(["operator", "--namespace=a", "-n", "b"]).kopf_args)
    assert options.namespace == ["a", "b"]


def test_settings_the_operator_does_not_know_are_named() -> None:
    from rlkube_operator.settings import unknown_variables

    environ = {"RLKUBE_OPERATOR_LOG_LEVEL": "debug", "RLKUBE_LOG_LEVEL": "debug", "HOME": "/home/rlkube"}
    assert unknown_variables(environ) == ["RLKUBE_OPERATOR_LOG_LEVEL"]


def test_operator_command_warns_about_unknown_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlkube_operator.cli import operator_command

    monkeypatch.setenv("RLKUBE_OPERATOR_METRICS_PORT", "8080")
    monkeypatch.setattr("kopf.run", lambda **_: None)
    assert operator_command(argparse.Namespace(kopf_args=[])) == 0
    assert "ignoring RLKUBE_OPERATOR_METRICS_PORT: not an operator setting" in capsys.readouterr().err

"""e2e/run.sh is strict, shellcheck-clean bash; --dry-run prints every step in order and runs none."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.delivery.chart import ROOT, tool

SCRIPT = ROOT / "e2e" / "run.sh"
TOOLS = ("docker", "kind", "kubectl", "helm")

#: What a run does, in order (each is a substring of a printed line).
STEPS = [
    "check: the Docker daemon answers",
    "+ kind create cluster --name rlkube-e2e --config",
    "+ docker build --tag rlkube:e2e",
    "+ kind load docker-image rlkube:e2e --name rlkube-e2e",
    "upgrade --install rlkube",
    "--set image.repository=rlkube --set image.tag=e2e",
    "wait --for=condition=Established crd/rljobs.rlkube.io",
    "rollout status deployment/rlkube-operator",
    "apply -f",
    "examples/rljob-kind.yaml",
    "wait --for=condition=Running rlj/cartpole-kind",
    "get pods -l rlkube.io/job-name=cartpole-kind,rlkube.io/role=train",
    "scale rlj/cartpole-kind --replicas=3",
    "statefulset/cartpole-kind-eval",
    "check: train pods kept their UIDs and restart counts",
    "check: the train StatefulSet's spec was not changed",
    "get rlj cartpole-kind",
    "check: column PHASE",
    "wait --for=condition=Complete rlj/cartpole-kind --timeout=30m",
    "delete rlj/cartpole-kind",
    "check: no child of the job is left",
    "uninstall rlkube",
    "dry run: nothing was run",
    "+ kind delete cluster --name rlkube-e2e",
]


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_script_is_shellcheck_clean() -> None:
    result = subprocess.run(
        [tool("shellcheck"), "--severity=style", "--enable=all", "--exclude=SC2250,SC2312", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_script_is_strict_bash() -> None:
    lines = SCRIPT.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    assert os.access(SCRIPT, os.X_OK)


def test_dry_run_prints_every_step_in_order() -> None:
    result = run_script("--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    position = 0
    for step in STEPS:
        found = out.find(step, position)
        assert found >= 0, f"step {step!r} missing (or out of order) in:\n{out}"
        position = found


def test_dry_run_runs_none_of_the_tools(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in TOOLS:
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{marker}"\nexit 1\n')
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("HELM", "KUBECTL", "KIND", "DOCKER")}
    env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
    result = run_script("--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"--dry-run ran: {marker.read_text()}"


def test_keep_cluster_skips_the_teardown() -> None:
    out = run_script("--dry-run", "--keep-cluster").stdout
    assert "kind delete cluster" not in out


def test_reuse_cluster_does_not_create_one() -> None:
    out = run_script("--dry-run", "--reuse-cluster", "--no-build").stdout
    assert "kind create cluster" not in out
    assert "kind export kubeconfig --name rlkube-e2e" in out
    assert "docker build" not in out
    assert "kind delete cluster" not in out, "a reused cluster is not ours to delete"


def test_settings_come_from_the_environment() -> None:
    env = {**os.environ, "RLKUBE_E2E_CLUSTER": "ci-7", "RLKUBE_E2E_IMAGE": "localhost:5001/rlkube:pr-7"}
    out = run_script("--dry-run", env=env).stdout
    assert "+ kind create cluster --name ci-7" in out
    assert "--set image.repository=localhost:5001/rlkube --set image.tag=pr-7" in out


@pytest.mark.parametrize("option", ["--wat", "dry-run"])
def test_unknown_options_are_refused(option: str) -> None:
    result = run_script(option)
    assert result.returncode == 2
    assert f"unknown option {option}" in result.stderr


def test_help_prints_the_usage() -> None:
    result = run_script("--help")
    assert result.returncode == 0
    assert "e2e/run.sh --dry-run" in result.stdout
    assert "RLKUBE_E2E_CLUSTER" in result.stdout


def test_kind_config_has_a_control_plane_and_two_workers() -> None:
    config = yaml.safe_load((ROOT / "e2e" / "kind.yaml").read_text())
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker", "worker"]

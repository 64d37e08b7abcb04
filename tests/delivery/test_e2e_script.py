"""e2e/run.sh is strict bash; --dry-run prints every step in order and runs none.

Shellcheck: tests/delivery/test_makefile.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rlkube.spec import parse_job
from rlkube_operator.crd import PRINTER_COLUMNS
from rlkube_operator.render import render
from rlkube_operator.settings import RenderSettings
from rlkube_operator.status import ConditionType

from tests.delivery.chart import ROOT

SCRIPT = ROOT / "e2e" / "run.sh"
TOOLS = ("docker", "kind", "kubectl", "helm")
#: Every optional check except SC2250 (braces around every variable) and SC2312 (no $(...) as an argument).
SHELLCHECK_ARGS = ["--severity=style", "--enable=all", "--exclude=SC2250,SC2312"]

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
    "check: the columns are NAME PHASE",
    "wait --for=condition=Complete rlj/cartpole-kind --timeout=30m",
    "delete rlj/cartpole-kind",
    "check: no child of the job is left",
    "uninstall rlkube",
    "dry run: nothing was run",
    "+ kind delete cluster --name rlkube-e2e",
]


def script_variable(name: str) -> str:
    found = re.search(rf'^{name}="(.*)"$', SCRIPT.read_text(), re.M)
    assert found, f"{name} is not set in {SCRIPT}"
    return found[1]


def test_the_columns_the_script_expects_are_the_crds_printer_columns() -> None:
    assert script_variable("COLUMNS").split() == [column["name"].upper() for column in PRINTER_COLUMNS]


def test_the_children_the_script_expects_gone_are_those_the_operator_creates() -> None:
    job = parse_job(yaml.safe_load((ROOT / "examples" / "rljob-kind.yaml").read_text()))
    # The chart's defaults: no per-job NetworkPolicy.
    rendered = [f"{o['kind'].lower()}/{o['metadata']['name']}" for o in render(job, RenderSettings())]
    children = script_variable("CHILDREN").replace("$JOB", job.name).split()
    assert children == rendered


def test_the_script_waits_only_for_conditions_the_operator_sets() -> None:
    waited = set(re.findall(r"--for=condition=(\w+)", SCRIPT.read_text()))
    assert waited - {"Established"} <= {c.value for c in ConditionType}
    assert {"Running", "Complete"} <= waited


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


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


# --- the script's real path, against stand-in tools (tests/delivery/fake_cluster.py) ----------------


def run_against_fakes(tmp_path: Path, scenario: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    fake = Path(__file__).with_name("fake_cluster.py")
    for name in TOOLS:
        (stubs / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" {name} "$@"\n')
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if k not in ("HELM", "KUBECTL", "KIND", "DOCKER")}
    env |= {
        "PATH": f"{stubs}{os.pathsep}{env['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_SCENARIO": scenario,
        "RLKUBE_E2E_ARTIFACTS": str(tmp_path / "artifacts"),
        "RLKUBE_E2E_GC_TIMEOUT": "1",
    }
    result = run_script(env=env)
    return result, log.read_text().splitlines() if log.exists() else []


def test_a_healthy_run_passes_and_deletes_its_cluster(tmp_path: Path) -> None:
    result, calls = run_against_fakes(tmp_path, "ok")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "==> e2e passed" in result.stdout
    assert calls[0] == "docker info"
    assert calls[-1] == "kind delete cluster --name rlkube-e2e"
    assert not (tmp_path / "artifacts").exists(), "no diagnostics for a passing run"


@pytest.mark.parametrize(
    ("scenario", "failure"),
    [
        ("train-restarted", "train pods kept their UIDs and restart counts"),
        ("missing-column", "the columns are NAME PHASE TRAIN EVAL EPOCH PUBLISHED LOADED RETURN AGE"),
        ("finished-early", "the job is still training"),
        ("children-left", "no child of the job is left (left: statefulset.apps/cartpole-kind-train"),
    ],
)
def test_a_failed_check_fails_the_run_dumps_diagnostics_and_still_tears_down(
    tmp_path: Path, scenario: str, failure: str
) -> None:
    result, calls = run_against_fakes(tmp_path, scenario)
    assert result.returncode == 1
    assert f"e2e FAILED: this does not hold: {failure}" in result.stderr
    artifacts = tmp_path / "artifacts"
    for name in ("objects.txt", "events.txt", "operator.log"):
        assert (artifacts / name).exists(), name
    assert any(c.startswith("kubectl --context kind-rlkube-e2e -n rlkube-system logs") for c in calls)
    assert calls[-1] == "kind delete cluster --name rlkube-e2e"

"""The control plane as a project component: its build, its cache, its start and its stop."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from rlkube_devcluster import REPO
from rlkube_devcluster.controlplane import build
from rlkube_devcluster.controlplane.build import BuildError, binaries_dir, ensure_binaries, kubernetes_version
from rlkube_devcluster.controlplane.cluster import (
    ControlPlane,
    ControlPlaneError,
    etcd_version,
    progress_notify_flag,
)

from tests.operator.harness import kubectl


def script(path: Path, text: str) -> Path:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_binaries_are_cached_outside_the_checkout_by_version_and_go_sum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLKUBE_CACHE", str(tmp_path))
    where = binaries_dir()
    assert where.parent == tmp_path / "controlplane"
    assert where.name.startswith(kubernetes_version() + "-")
    assert kubernetes_version().startswith("v1.")
    assert REPO not in where.parents


def test_without_go_the_build_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKUBE_CACHE", str(tmp_path))
    monkeypatch.delenv("GO", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "_FALLBACK_GO", tmp_path / "no-go")
    with pytest.raises(BuildError, match="needs the Go toolchain"):
        ensure_binaries()


def test_a_failed_build_reports_the_command_and_its_output_and_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLKUBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GO", str(script(tmp_path / "go", "echo 'undefined: something' >&2; exit 2\n")))
    with pytest.raises(BuildError) as failed:
        ensure_binaries()
    assert "exit 2" in str(failed.value)
    assert "undefined: something" in str(failed.value)
    assert not binaries_dir().exists()
    assert os.listdir(tmp_path / "cache" / "controlplane") == [".build.lock"]


def test_a_component_that_exits_fails_the_start_with_its_log_and_stops_the_rest(tmp_path: Path) -> None:
    binaries = tmp_path / "bin"
    binaries.mkdir()
    for name in build.COMMANDS:
        script(binaries / name, "echo 'flag provided but not defined: -nonsense' >&2; exit 1\n")
    plane = ControlPlane(tmp_path / "plane", binaries=binaries)
    with pytest.raises(ControlPlaneError, match="flag provided but not defined"):
        plane.start()
    assert plane.components == []  # etcd, which had started, was stopped


def test_a_stopped_control_plane_leaves_no_process(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "plane").start()
    pids = [c.process.pid for c in plane.components]
    assert [c.name for c in plane.components] == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    plane.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_etcd_is_told_to_announce_its_progress_in_the_flag_its_version_knows() -> None:
    assert etcd_version("etcd Version: 3.5.1\nGit SHA: e8732fb5f\n") == (3, 5)
    assert etcd_version("etcd Version: 3.6.4\n") == (3, 6)
    assert progress_notify_flag((3, 5), "1s") == "--experimental-watch-progress-notify-interval=1s"
    assert progress_notify_flag((3, 6), "1s") == "--watch-progress-notify-interval=1s"
    with pytest.raises(ControlPlaneError, match="cannot tell etcd's version"):
        etcd_version("flag provided but not defined: -version")


def test_a_resource_nobody_writes_is_listed_at_the_revision_a_write_of_another_returned(
    control_plane: ControlPlane,
) -> None:
    """What controllers' informers ask after a write: "this resource, as of at least revision N".
    The API server answers from its watch cache, which learns how far etcd has got from the
    resource's own events and from etcd's progress notifications; for a resource nothing writes,
    only from the notifications. Without them (etcd's default: every 10 minutes) it refuses with
    "Too large resource version" after 3 s, again and again: the StatefulSet controller once
    created no pod for 5 minutes that way."""
    admin = control_plane.kubeconfig
    name = f"written-{os.getpid()}-{time.monotonic_ns()}"
    written = kubectl(
        admin, "-n", "default", "create", "configmap", name, "-o", "jsonpath={.metadata.resourceVersion}"
    ).stdout
    try:
        path = f"/api/v1/podtemplates?resourceVersion={written}&resourceVersionMatch=NotOlderThan"
        refusals = []
        deadline = time.monotonic() + 60
        while True:
            answer = kubectl(admin, "get", "--raw", path, check=False)
            if answer.returncode == 0:
                break
            refusals.append(answer.stderr.strip())
            assert time.monotonic() < deadline, f"refused {len(refusals)} times: {refusals[-1]}"
        assert '"kind":"PodTemplateList"' in answer.stdout
    finally:
        kubectl(admin, "-n", "default", "delete", "configmap", name, check=False)

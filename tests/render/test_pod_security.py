"""RLJob pods run as the image's non-root user; which Pod Security profile each weight strategy needs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rlkube import contract as c
from rlkube.spec import parse_job
from rlkube_operator import render as r
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB
from tests.render.pod_security import baseline_violations, restricted_violations

SETTINGS = RenderSettings(default_image="rlkube:test", image_pull_policy="IfNotPresent")


def pods(strategy: str, **spec: Any) -> dict[str, dict[str, Any]]:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {"name": "cartpole", "namespace": "rl", "uid": "u-1"}
    document["spec"].update(spec)
    document["spec"]["policy"] = {"weightBuffer": {"strategy": strategy}}
    job = parse_job(document)
    return {
        "train": r.render_train_statefulset(job, SETTINGS)["spec"]["template"]["spec"],
        "eval": r.render_eval_statefulset(job, SETTINGS)["spec"]["template"]["spec"],
    }


@pytest.mark.parametrize("strategy", ["Double", "None"])
def test_in_memory_strategies_meet_pod_security_restricted(strategy: str) -> None:
    for role, pod in pods(strategy, checkpoint={"claimName": "runs"}).items():
        assert restricted_violations(pod) == [], role
        assert "initContainers" not in pod


@pytest.mark.parametrize("strategy", ["Shared", "Sharded"])
def test_host_path_strategies_need_a_namespace_that_allows_host_path(strategy: str) -> None:
    # Both roles mount the node's weight directory (rank 0 writes it, eval pods read it).
    for role, pod in pods(strategy).items():
        assert baseline_violations(pod) == ["baseline: hostPath volume weights"], role
        assert restricted_violations(pod) == [
            "baseline: hostPath volume weights",
            "restricted: volume type hostPath",
            f"restricted: {r.WEIGHTS_DIR_INIT} runAsNonRoot is not true",
            f"restricted: {r.WEIGHTS_DIR_INIT} runAsUser 0",
            f"restricted: {r.WEIGHTS_DIR_INIT} adds ['CHOWN']",
        ], role


@pytest.mark.parametrize("role", ["train", "eval"])
def test_pods_run_as_the_images_non_root_user(role: str) -> None:
    pod = pods("Double")[role]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == c.IMAGE_USER_ID
    assert pod["securityContext"]["runAsGroup"] == c.IMAGE_GROUP_ID
    # fsGroup: a checkpoint PersistentVolumeClaim is writable for that user.
    assert pod["securityContext"]["fsGroup"] == c.IMAGE_GROUP_ID
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_host_path_weight_directory_is_handed_to_the_images_user_before_the_pod_starts() -> None:
    pod = pods("Shared")["eval"]
    (init,) = pod["initContainers"]
    (container,) = pod["containers"]
    volume = next(v for v in pod["volumes"] if v["name"] == "weights")
    assert volume["hostPath"] == {"path": "/dev/shm/rlkube/rl-cartpole", "type": "DirectoryOrCreate"}
    assert init["command"] == ["chown", f"{c.IMAGE_USER_ID}:{c.IMAGE_GROUP_ID}", c.SHM_DIR]
    assert init["volumeMounts"] == [{"name": "weights", "mountPath": c.SHM_DIR}]
    assert {"name": "weights", "mountPath": c.SHM_DIR} in container["volumeMounts"]
    # The same image (it has chown) and pull policy as the pod; root with CAP_CHOWN and nothing else.
    assert (init["image"], init["imagePullPolicy"]) == (container["image"], container["imagePullPolicy"])
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["resources"]["requests"]


def test_the_checker_sees_what_it_checks() -> None:
    pod = copy.deepcopy(pods("Double")["eval"])
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod["hostNetwork"] = True
    del pod["securityContext"]["seccompProfile"]
    assert restricted_violations(pod) == [
        "baseline: hostNetwork",
        "baseline: eval privileged",
        "restricted: eval allowPrivilegeEscalation is not false",
        "restricted: eval seccompProfile",
    ]

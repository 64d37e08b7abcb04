"""Every rendered object passes kubernetes-validate --strict for each Kubernetes release we support."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from rlkube.spec import parse_job
from rlkube_operator.defaults import parse_pod_defaults
from rlkube_operator.render import render
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB
from tests.render.gpu_defaults import GPU_DEFAULTS

VERSIONS = [f"1.{minor}.0" for minor in range(29, 36)]

FULL_SPEC: dict[str, Any] = {
    "image": "rlkube:1",
    "policy": {"weightBuffer": {"strategy": "Double", "shmSizeLimit": "1Gi"}},
    "trainer": {
        "replicas": 2,
        "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "4Gi"}, "requests": {"cpu": "500m"}},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
                }
            }
        },
        "priorityClassName": "high",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "trainer",
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "labels": {"team": "rl"},
        "annotations": {"note": "x"},
    },
    "evaluator": {"replicas": 3, "imagePullPolicy": "IfNotPresent"},
    "checkpoint": {"claimName": "runs"},
}

CASES = {
    "minimal": {},
    "full": FULL_SPEC,
    "shared": {"policy": {"weightBuffer": {"strategy": "Shared"}}},
    "none": {"policy": {"weightBuffer": {"strategy": "None"}}},
    # Rendered under the operator's per-role pod defaults (tests/render/test_pod_defaults.py).
    "defaults": {"trainer": {"resources": {"requests": {"memory": "8Gi"}}}},
}


def objects(case: str) -> list[dict[str, Any]]:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {
        "name": "cartpole",
        "namespace": "rl",
        "uid": "6d1c5c2e-1111-4d7e-9a4e-1f0000000001",
    }
    document["spec"].update(copy.deepcopy(CASES[case]))
    defaults = parse_pod_defaults(GPU_DEFAULTS if case == "defaults" else {})
    settings = RenderSettings(network_policy=True, train_shm_size="2Gi", pod_defaults=defaults)
    return render(parse_job(document), settings)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_objects_are_valid_kubernetes(case: str, version: str) -> None:
    for obj in objects(case):
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_versions_we_check_are_all_known_to_kubernetes_validate() -> None:
    known = {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()}
    assert {kubernetes_validate.utils.major_minor(v) for v in VERSIONS} <= known


def test_strict_validation_would_catch_an_unknown_field() -> None:
    broken = objects("minimal")[1]
    broken["spec"]["bogus"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)

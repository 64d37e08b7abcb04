"""The operator's per-role pod defaults (the chart's jobDefaults) go under each job's own settings."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from rlkube.contract import Role
from rlkube.spec import EvaluatorSpec, PodSpecOverrides, TrainerSpec, parse_job
from rlkube_operator import render as r
from rlkube_operator.defaults import (
    DEFAULTABLE_KEYS,
    PodDefaults,
    PodDefaultsError,
    merged_role,
    parse_pod_defaults,
    with_pod_defaults,
)
from rlkube_operator.settings import RenderSettings, load_settings

from tests.conftest import MINIMAL_JOB
from tests.render.gpu_defaults import GPU_DEFAULTS, GPU_TOLERATION


def job(**spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {"name": "cartpole", "namespace": "rl", "uid": "u-1"}
    document["spec"].update(spec)
    return parse_job(document)


def settings(defaults: dict[str, Any] = GPU_DEFAULTS) -> RenderSettings:
    return RenderSettings(default_image="rlkube:test", pod_defaults=parse_pod_defaults(defaults))


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def test_a_job_that_sets_nothing_gets_every_default() -> None:
    train = r.render_train_statefulset(job(), settings())
    pod = pod_spec(train)
    (container,) = pod["containers"]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "memory": "64Gi"},
        "requests": {"cpu": "8", "memory": "32Gi"},
    }
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [GPU_TOLERATION]
    assert pod["priorityClassName"] == "training"
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in container["env"]
    assert train["spec"]["template"]["metadata"]["labels"]["tier"] == "gpu"


def test_gpus_from_the_defaults_choose_nccl() -> None:
    env = {
        e["name"]: e.get("value")
        for e in pod_spec(r.render_train_statefulset(job(), settings()))["containers"][0]["env"]
    }
    assert env["RLKUBE_BACKEND"] == "nccl"
    plain = r.render_train_statefulset(job(), RenderSettings())
    assert {e["name"]: e.get("value") for e in pod_spec(plain)["containers"][0]["env"]}[
        "RLKUBE_BACKEND"
    ] == "gloo"


def test_each_role_gets_only_its_own_defaults() -> None:
    evaluator = pod_spec(r.render_eval_statefulset(job(), settings()))
    assert evaluator["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    assert "nodeSelector" not in evaluator
    assert "tolerations" not in evaluator


def test_a_resource_the_job_names_is_entirely_the_jobs() -> None:
    # The job asks for more memory than the default limit: the default memory limit must not stay.
    own = TrainerSpec.model_validate({"resources": {"requests": {"memory": "100Gi"}}})
    merged = merged_role(own, parse_pod_defaults(GPU_DEFAULTS).trainer)
    assert merged.resources.requests == {"cpu": "8", "memory": "100Gi"}
    assert merged.resources.limits == {"nvidia.com/gpu": 1}


def test_the_jobs_keys_win_in_maps_and_env_and_tolerations_add_up() -> None:
    spot = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    own = TrainerSpec.model_validate(
        {
            "nodeSelector": {"nvidia.com/gpu.present": "false", "zone": "a"},
            "labels": {"team": "rl"},
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "MINE", "value": "1"}],
            "tolerations": [spot, GPU_TOLERATION],
            "priorityClassName": "urgent",
        }
    )
    merged = merged_role(own, parse_pod_defaults(GPU_DEFAULTS).trainer)
    assert merged.node_selector == {"nvidia.com/gpu.present": "false", "zone": "a"}
    assert merged.labels == {"team": "rl", "tier": "gpu"}
    assert merged.env == [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "MINE", "value": "1"}]
    assert merged.tolerations == [spot, GPU_TOLERATION]
    assert merged.priority_class_name == "urgent"


@pytest.mark.parametrize(
    "own",
    [
        {},
        {"resources": {"limits": {"memory": "1Gi"}}},
        {"env": [{"name": "A", "value": "1"}], "tolerations": [GPU_TOLERATION]},
        {"replicas": 3, "backend": "gloo", "affinity": {"nodeAffinity": {}}},
    ],
)
def test_merging_twice_gives_what_merging_once_gives(own: dict[str, Any]) -> None:
    defaults = parse_pod_defaults(GPU_DEFAULTS).trainer
    once = merged_role(TrainerSpec.model_validate(own), defaults)
    assert merged_role(once, defaults) == once
    assert once.replicas == TrainerSpec.model_validate(own).replicas
    assert once.backend == TrainerSpec.model_validate(own).backend


def test_no_defaults_leave_the_job_as_it_is() -> None:
    plain = job(trainer={"replicas": 2})
    assert with_pod_defaults(plain, PodDefaults()) is plain
    assert merged_role(plain.spec.evaluator, PodSpecOverrides()) is plain.spec.evaluator


def test_the_defaulted_job_keeps_its_identity_and_status() -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {"name": "j", "namespace": "rl", "uid": "u-9", "generation": 4}
    document["status"] = {"phase": "Running"}
    defaulted = with_pod_defaults(parse_job(document), parse_pod_defaults(GPU_DEFAULTS))
    assert defaulted.metadata.model_extra == {"uid": "u-9", "generation": 4}
    assert defaulted.status == {"phase": "Running"}
    assert isinstance(defaulted.spec.evaluator, EvaluatorSpec)
    assert defaulted.spec.trainer.gpus() == 1


def test_changed_defaults_roll_the_pods_and_the_config_map_keeps_the_job_as_written() -> None:
    before = r.render_eval_statefulset(job(), settings({}))
    after = r.render_eval_statefulset(job(), settings())
    key = r.ANNOTATION_SPEC_HASH
    assert (
        before["spec"]["template"]["metadata"]["annotations"][key]
        != (after["spec"]["template"]["metadata"]["annotations"][key])
    )
    assert r.render_config_map(job(), settings({}))["data"] == r.render_config_map(job(), settings())["data"]


def test_defaults_reach_the_operator_as_one_json_setting() -> None:
    loaded = load_settings({"RLKUBE_DEFAULT_POD_SETTINGS": json.dumps(GPU_DEFAULTS)})
    assert loaded.render.pod_defaults == parse_pod_defaults(GPU_DEFAULTS)
    assert loaded.render.pod_defaults.for_role(Role.TRAIN).gpus() == 1
    assert load_settings({}).render.pod_defaults.is_empty()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"trainer": {"replicas": 2}}, "trainer.replicas: set per job"),
        ({"trainer": {"backend": "nccl"}}, "trainer.backend: set per job"),
        ({"evaluator": {"replicas": 0}}, "evaluator.replicas: set per job"),
        ({"workers": {}}, "workers: unknown section"),
        ({"trainer": {"nodeSelectr": {}}}, "trainer.nodeSelectr"),
        ({"trainer": {"imagePullPolicy": "Sometimes"}}, "trainer.imagePullPolicy"),
        ({"evaluator": {"env": [{"name": "RLKUBE_ROLE", "value": "x"}]}}, "evaluator.env: RLKUBE_ROLE"),
        ({"trainer": {"env": [{"name": "WORLD_SIZE", "value": "9"}]}}, "trainer.env: WORLD_SIZE"),
        ({"trainer": []}, "trainer: expected an object"),
        ([], "expected a JSON object"),
    ],
)
def test_bad_defaults_are_refused_naming_the_key(value: Any, named: str) -> None:
    with pytest.raises(PodDefaultsError) as caught:
        parse_pod_defaults(value)
    assert named in str(caught.value)


def test_defaultable_keys_are_a_roles_keys_without_the_per_job_ones() -> None:
    assert "replicas" not in DEFAULTABLE_KEYS
    assert "backend" not in DEFAULTABLE_KEYS
    assert {"resources", "nodeSelector", "tolerations", "env", "imagePullPolicy"} <= set(DEFAULTABLE_KEYS)
    for key in DEFAULTABLE_KEYS:
        assert key in EvaluatorSpec.model_json_schema(by_alias=True)["properties"]

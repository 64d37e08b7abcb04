"""spec.scheduling: the train ranks are one gang for Volcano, coscheduling or Kueue; eval stays elastic.

Each PodGroup is checked against the CRD schema of the project that defines it (tests/scheduling/
schemas, copied from their repositories), and every rendered object against Kubernetes' own schema.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate
import pytest
from rlkube.spec import SpecError, parse_job
from rlkube_operator import render as r
from rlkube_operator.crd import build_crd
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB
from tests.scheduling.schemas import problems

SETTINGS = RenderSettings(default_image="rlkube:test")
GPU_TRAINER = {
    "replicas": 4,
    "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}, "requests": {"cpu": "500m"}},
}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def job(scheduling: dict[str, Any] | None = None, **spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"] = {"name": "cartpole", "namespace": "rl", "uid": "u-1"}
    document["spec"].update({"trainer": copy.deepcopy(GPU_TRAINER), "evaluator": {"replicas": 3}, **spec})
    if scheduling is not None:
        document["spec"]["scheduling"] = scheduling
    return parse_job(document)


def objects(scheduling: dict[str, Any] | None = None, **spec: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in r.render(job(scheduling, **spec), SETTINGS)}


def pod_template(objs: dict[tuple[str, str], dict[str, Any]], role: str) -> dict[str, Any]:
    template: dict[str, Any] = objs[("StatefulSet", f"cartpole-{role}")]["spec"]["template"]
    return template


GANGS = {
    "volcano": {"gang": "volcano", "queue": "research"},
    "coscheduling": {"gang": "coscheduling", "scheduleTimeoutSeconds": 120},
    "kueue": {"gang": "kueue", "queue": "team-a"},
    "kueue-pods": {"gang": "kueue", "queue": "team-a", "kueueIntegration": "Pod"},
}


# Volcano -------------------------------------------------------------------------------------


def test_volcano_gang_is_a_pod_group_of_every_rank_with_their_summed_requests() -> None:
    objs = objects(GANGS["volcano"], trainer={**GPU_TRAINER, "priorityClassName": "rl-high"})
    group = objs[("PodGroup", "cartpole-train")]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 4,
        "minResources": {"cpu": "2000m", "nvidia.com/gpu": "4", "memory": "32Gi"},
        "queue": "research",
        "priorityClassName": "rl-high",
    }
    assert group["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert problems(group) == []


def test_volcano_train_pods_name_their_group_and_the_volcano_scheduler() -> None:
    train = pod_template(objects(GANGS["volcano"]), "train")
    assert train["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "cartpole-train"
    assert train["spec"]["schedulerName"] == "volcano"


def test_a_schedulername_of_the_trainer_names_the_gang_scheduler() -> None:
    objs = objects(GANGS["volcano"], trainer={**GPU_TRAINER, "schedulerName": "volcano-gpu"})
    assert pod_template(objs, "train")["spec"]["schedulerName"] == "volcano-gpu"


# scheduler-plugins coscheduling --------------------------------------------------------------


def test_coscheduling_gang_is_a_pod_group_with_its_schedule_timeout() -> None:
    objs = objects(GANGS["coscheduling"])
    group = objs[("PodGroup", "cartpole-train")]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {
        "minMember": 4,
        "minResources": {"cpu": "2000m", "nvidia.com/gpu": "4", "memory": "32Gi"},
        "scheduleTimeoutSeconds": 120,
    }
    assert problems(group) == []
    train = pod_template(objs, "train")
    assert train["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "cartpole-train"
    assert train["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_a_pod_group_without_requests_leaves_min_resources_out() -> None:
    group = objects(GANGS["coscheduling"], trainer={"replicas": 2})[("PodGroup", "cartpole-train")]
    assert group["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 120}
    assert problems(group) == []


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    group = objects(GANGS["coscheduling"])[("PodGroup", "cartpole-train")]
    group["spec"]["minMembers"] = 4  # a typo: strict field validation refuses it
    group["spec"]["minResources"]["cpu"] = "two"
    found = problems(group)
    assert len(found) == 2
    assert "spec: Additional properties are not allowed ('minMembers' was unexpected)" in found
    assert any(problem.startswith("spec.minResources.cpu: 'two' does not match") for problem in found)


# Kueue ---------------------------------------------------------------------------------------


def test_kueue_statefulset_integration_queues_the_train_statefulset() -> None:
    objs = objects(GANGS["kueue"])
    train = objs[("StatefulSet", "cartpole-train")]
    assert train["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert train["spec"]["podManagementPolicy"] == "Parallel"  # Kueue creates the pods' group at once
    assert not any(k.startswith("kueue.x-k8s.io/") for k in pod_template(objs, "train")["metadata"]["labels"])
    assert ("PodGroup", "cartpole-train") not in objs


def test_kueue_pod_integration_labels_the_train_pods_as_one_group_of_every_rank() -> None:
    train = pod_template(objects(GANGS["kueue-pods"]), "train")
    labels, annotations = train["metadata"]["labels"], train["metadata"]["annotations"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/pod-group-name"] == "cartpole-train"
    assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "4"
    # What Kueue's pod webhook checks: the group name is a valid object name, the count an integer.
    assert DNS_SUBDOMAIN.match(labels["kueue.x-k8s.io/pod-group-name"])
    assert all(LABEL_VALUE.match(value) and len(value) <= 63 for value in labels.values())
    assert "schedulerName" not in train["spec"]  # Kueue gates pods; the default scheduler places them


# Eval stays elastic; every object stays valid Kubernetes -------------------------------------


@pytest.mark.parametrize("gang", sorted(GANGS))
def test_eval_pods_never_join_the_gang(gang: str) -> None:
    objs = objects(GANGS[gang])
    plain = objects()
    assert (
        objs[("StatefulSet", "cartpole-eval")]["spec"]["template"]["spec"]
        == (plain[("StatefulSet", "cartpole-eval")]["spec"]["template"]["spec"])
    )
    evals = objs[("StatefulSet", "cartpole-eval")]
    marks = {**evals["metadata"]["labels"], **evals["spec"]["template"]["metadata"]["labels"]}
    marks.update(evals["spec"]["template"]["metadata"]["annotations"])
    assert not [k for k in marks if k.startswith(("kueue.x-k8s.io/", "scheduling."))]


@pytest.mark.parametrize("gang", sorted(GANGS))
def test_scaling_eval_leaves_the_gang_alone(gang: str) -> None:
    before = objects(GANGS[gang])
    after = objects(GANGS[gang], evaluator={"replicas": 9})
    changed = [key for key in before if before[key] != after[key]]
    assert changed == [("StatefulSet", "cartpole-eval")]


@pytest.mark.parametrize("gang", sorted(GANGS))
def test_gang_scheduled_objects_are_valid_kubernetes(gang: str) -> None:
    for obj in objects(GANGS[gang]).values():
        if obj["kind"] == "PodGroup":
            assert problems(obj) == []
        else:
            kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_no_gang_renders_no_pod_group_and_no_scheduler() -> None:
    objs = objects()
    assert not [key for key in objs if key[0] == "PodGroup"]
    assert "schedulerName" not in pod_template(objs, "train")["spec"]


def test_a_job_that_never_asked_for_a_gang_keeps_its_spec_hash() -> None:
    default = r.spec_hash(job(), SETTINGS)
    assert r.spec_hash(job({}), SETTINGS) == default
    assert r.spec_hash(job({"gang": "none", "disruptionBudget": True}), SETTINGS) == default
    assert r.spec_hash(job(GANGS["volcano"]), SETTINGS) != default


# The train PodDisruptionBudget ---------------------------------------------------------------


def test_train_ranks_have_a_disruption_budget_that_keeps_every_ready_rank() -> None:
    budget = objects()[("PodDisruptionBudget", "cartpole-train")]
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"] == {
        "minAvailable": 4,
        "selector": {"matchLabels": {"rlkube.io/job-name": "cartpole", "rlkube.io/role": "train"}},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def test_a_stopped_job_or_a_budget_turned_off_allows_every_eviction() -> None:
    assert r.render_train_disruption_budget(job(), SETTINGS, stopped=True)["spec"]["minAvailable"] == 0
    off = objects({"disruptionBudget": False})[("PodDisruptionBudget", "cartpole-train")]
    assert off["spec"]["minAvailable"] == 0


# What the spec refuses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheduling", "message"),
    [
        ({"gang": "kueue"}, "spec.scheduling.queue: got None, expected the name of a Kueue LocalQueue"),
        ({"gang": "coscheduling", "queue": "q"}, "spec.scheduling.queue: got 'q', expected no queue"),
        ({"gang": "volcano", "scheduleTimeoutSeconds": 5}, "spec.scheduling.scheduleTimeoutSeconds: got 5"),
        ({"gang": "slurm"}, "spec.scheduling.gang: got 'slurm'"),
        ({"gang": "volcano", "queue": "Bad_Queue"}, "spec.scheduling.queue: got 'Bad_Queue'"),
        ({"gang": "volcano", "minMember": 2}, "spec.scheduling.minMember: unknown field"),
    ],
)
def test_a_scheduling_section_that_cannot_work_is_refused_naming_the_field(
    scheduling: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        job(scheduling)
    assert any(problem.startswith(message) for problem in caught.value.problems), caught.value.problems


def test_the_crd_carries_the_same_rules_as_cel() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    section = schema["properties"]["spec"]["properties"]["scheduling"]
    rules = [rule["rule"] for rule in section["x-kubernetes-validations"]]
    assert "self.gang != 'kueue' || has(self.queue)" in rules
    assert section["properties"]["gang"]["enum"] == ["none", "volcano", "coscheduling", "kueue"]

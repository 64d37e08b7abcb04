"""The pure side of the Kueue integration (rlkube_operator.kueue_workload), one case per decision."""

from __future__ import annotations

from typing import Any

from rlkube.contract import Role
from rlkube.spec import RLJob, parse_job
from rlkube_operator.kueue_workload import (
    Admission,
    Placement,
    QueueState,
    overlay_status,
    place,
    read_admission,
    released_status,
    render_workload,
    uses_workload,
    within_admission,
)
from rlkube_operator.render import render
from rlkube_operator.settings import RenderSettings

SETTINGS = RenderSettings(default_image="rlkube:test")
STAMP = "2026-01-01T00:00:00Z"


def job(suspend: bool = False, **trainer: Any) -> RLJob:
    return parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "cartpole", "namespace": "team", "uid": "u-1"},
            "spec": {
                "env": {"id": "CartPole-v1"},
                "trainer": {"replicas": 4, "resources": {"requests": {"cpu": "2"}}, **trainer},
                "evaluator": {"replicas": 3, "resources": {"requests": {"cpu": "1"}}},
                "runPolicy": {"suspend": suspend},
                "scheduling": {"gang": "kueue", "queue": "research", "kueueIntegration": "RLJob"},
            },
        }
    )


def workload(*conditions: tuple[str, str, str], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "rljob-cartpole", "generation": 1, "resourceVersion": "7"},
        "status": {
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": f"{r} says Kueue",
                    "lastTransitionTime": STAMP,
                }
                for t, s, r in conditions
            ],
            **({"admission": admission} if admission else {}),
        },
    }


ADMISSION = {
    "clusterQueue": "gpus",
    "podSetAssignments": [
        {"name": "train", "flavors": {"cpu": "a100", "memory": "a100"}},
        {"name": "eval", "flavors": {"cpu": "spot"}},
    ],
}


def test_the_workload_has_a_podset_per_role_with_the_pod_templates_requests() -> None:
    rendered = render_workload(job(), SETTINGS, priority=None)
    assert uses_workload(job())
    assert rendered["spec"]["queueName"] == "research"
    assert [(p["name"], p["count"]) for p in rendered["spec"]["podSets"]] == [("train", 4), ("eval", 3)]
    train = rendered["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    assert train["resources"]["requests"]["cpu"] == "2"
    assert rendered["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert rendered["spec"]["active"] is True
    assert "priorityClassRef" not in rendered["spec"]


def test_a_suspended_job_has_an_inactive_workload_and_a_priority_class_gives_its_value() -> None:
    rendered = render_workload(job(suspend=True, priorityClassName="high"), SETTINGS, priority=1000)
    assert rendered["spec"]["active"] is False
    assert rendered["spec"]["priority"] == 1000
    assert rendered["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }


def test_a_workload_waiting_for_quota_is_queued_with_kueues_reason() -> None:
    found = read_admission(workload(("QuotaReserved", "False", "Pending")))
    assert (found.state, found.reason, found.message) == (QueueState.QUEUED, "Pending", "Pending says Kueue")
    assert read_admission(None).state is QueueState.QUEUED


def test_an_admitted_workload_names_each_podsets_flavours() -> None:
    found = read_admission(
        workload(
            ("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"), admission=ADMISSION
        )
    )
    assert found.runs
    assert found.cluster_queue == "gpus"
    assert found.flavors == {"train": ("a100",), "eval": ("spot",)}


def test_an_evicted_workload_is_preempted_until_the_integration_releases_it() -> None:
    evicted = workload(
        ("QuotaReserved", "True", "QuotaReserved"),
        ("Admitted", "True", "Admitted"),
        ("Evicted", "True", "Preempted"),
        admission=ADMISSION,
    )
    found = read_admission(evicted)
    assert (found.state, found.reason, found.has_reservation) == (QueueState.PREEMPTED, "Preempted", True)
    released = released_status(evicted, stamp="2026-01-01T00:01:00Z")
    assert released["admission"] is None
    by_type = {c["type"]: c for c in released["conditions"]}
    assert (by_type["QuotaReserved"]["status"], by_type["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert by_type["Admitted"]["status"] == "False"
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == ("True", "Preempted")
    assert by_type["Evicted"]["status"] == "True"  # Kueue's own, left as it is


def test_a_finished_workload_is_finished() -> None:
    assert read_admission(workload(("Finished", "True", "Succeeded"))).state is QueueState.FINISHED


def test_the_admitted_flavours_reach_only_the_statefulsets_pods() -> None:
    objects = render(job(), SETTINGS)
    placed = place(
        objects,
        {
            Role.TRAIN: Placement({"pool": "a100"}, ({"key": "gpu", "operator": "Exists"},)),
            Role.EVAL: Placement({"pool": "spot"}),
        },
    )
    by_name = {o["metadata"]["name"]: o for o in placed}
    train = by_name["cartpole-train"]["spec"]["template"]["spec"]
    assert train["nodeSelector"]["pool"] == "a100"
    assert {"key": "gpu", "operator": "Exists"} in train["tolerations"]
    assert by_name["cartpole-eval"]["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "spot"
    assert "nodeSelector" not in objects[-1]["spec"]["template"]["spec"]  # the input is not changed
    unchanged = [o for o in placed if o["kind"] != "StatefulSet"]
    assert unchanged == [o for o in objects if o["kind"] != "StatefulSet"]


def test_the_suspended_condition_says_queued_admitted_or_preempted_with_kueues_words() -> None:
    status = {
        "phase": "Suspended",
        "message": "runPolicy.suspend is true: scaled to zero",
        "conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": ""}],
    }
    queued = overlay_status(status, Admission(QueueState.QUEUED, "Pending", "couldn't assign flavors"))
    assert queued["conditions"][0]["reason"] == "Queued"
    assert queued["message"] == "queued by Kueue (Pending): couldn't assign flavors"
    preempted = overlay_status(status, Admission(QueueState.PREEMPTED, "Preempted", "to fit a higher one"))
    assert preempted["conditions"][0]["reason"] == "Preempted"
    assert "(Preempted): to fit a higher one" in preempted["message"]
    running = {**status, "phase": "Running", "conditions": [{**status["conditions"][0], "status": "False"}]}
    admitted = overlay_status(running, Admission(QueueState.ADMITTED, cluster_queue="gpus"))
    assert admitted["conditions"][0]["reason"] == "Admitted"
    assert admitted["message"] == running["message"]  # a running job's message is its own


def test_eval_pods_beyond_the_admitted_count_wait() -> None:
    objects = render(job(), SETTINGS)  # 3 eval replicas asked for
    admitted = Admission(QueueState.ADMITTED, counts={"train": 4, "eval": 2})
    by_name = {o["metadata"]["name"]: o for o in within_admission(objects, admitted)}
    assert by_name["cartpole-eval"]["spec"]["replicas"] == 2
    assert by_name["cartpole-train"]["spec"]["replicas"] == 4

"""The operator's Kueue calls (rlkube_operator.kueue_gate) against an in-memory API: what it writes when."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from rlkube.spec import RLJob, parse_job
from rlkube_operator.kueue_gate import KueueGate
from rlkube_operator.kueue_workload import QueueState
from rlkube_operator.settings import RenderSettings

SETTINGS = RenderSettings(default_image="rlkube:test")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        stored = copy.deepcopy(obj)
        old = self.objects.get(key)
        stored["metadata"]["resourceVersion"] = str(len(self.writes) + 1)
        if old is not None:
            stored["status"] = old.get("status", {})
        self.objects[key] = stored
        self.writes.append(("apply", obj["metadata"]["name"]))
        return copy.deepcopy(stored)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.writes.append(("delete", name))
        return self.objects.pop((kind, namespace, name), None) is not None

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Any, **_: Any
    ) -> Any:
        self.writes.append(("status", name))
        self.objects[(kind, namespace, name)].setdefault("status", {}).update(patch)
        return self.objects[(kind, namespace, name)]

    def admit(self, name: str, *, eval_count: int | None = None) -> None:
        """What Kueue's scheduler writes when it admits a Workload."""
        workload = self.objects[("Workload", "team", name)]
        assignments = [
            {"name": p["name"], "flavors": {"cpu": "default"}, "count": p["count"]}
            for p in workload["spec"]["podSets"]
        ]
        workload["status"] = {
            "admission": {"clusterQueue": "cq", "podSetAssignments": assignments},
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
        }

    def evict(self, name: str) -> None:
        self.objects[("Workload", "team", name)]["status"]["conditions"].append(
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "for a higher one"}
        )


def job(evals: int = 1, suspend: bool = False) -> RLJob:
    return parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "cartpole", "namespace": "team", "uid": "u-1"},
            "spec": {
                "env": {"id": "CartPole-v1"},
                "evaluator": {"replicas": evals},
                "runPolicy": {"suspend": suspend},
                "scheduling": {"gang": "kueue", "queue": "research", "kueueIntegration": "RLJob"},
            },
        }
    )


def gate() -> tuple[KueueGate, FakeKube]:
    kube = FakeKube()
    return KueueGate(kube, SETTINGS), kube  # type: ignore[arg-type]


def test_the_workload_is_created_once_and_left_alone_while_nothing_changes() -> None:
    g, kube = gate()
    assert g.admission(job()).state is QueueState.QUEUED
    assert g.admission(job()).state is QueueState.QUEUED
    assert kube.writes == [("apply", "rljob-cartpole")]


def test_a_scale_while_queued_resizes_the_workload_and_a_suspend_deactivates_it() -> None:
    g, kube = gate()
    g.admission(job())
    g.admission(job(evals=3))
    pod_sets = kube.objects[("Workload", "team", "rljob-cartpole")]["spec"]["podSets"]
    assert [p["count"] for p in pod_sets] == [1, 3]
    g.admission(job(evals=3, suspend=True))
    assert kube.objects[("Workload", "team", "rljob-cartpole")]["spec"]["active"] is False


def test_a_scale_of_an_admitted_job_queues_the_extra_eval_replicas_as_a_slice() -> None:
    g, kube = gate()
    g.admission(job())
    kube.admit("rljob-cartpole")
    admitted = g.admission(job(evals=4))
    assert admitted.runs
    assert admitted.counts["eval"] == 1  # the slice is not admitted yet
    assert admitted.eval_slice is not None
    slice_ = kube.objects[("Workload", "team", "rljob-cartpole-eval")]
    assert [(p["name"], p["count"]) for p in slice_["spec"]["podSets"]] == [("eval", 3)]
    kube.admit("rljob-cartpole-eval")
    assert g.admission(job(evals=4)).counts["eval"] == 4
    g.admission(job(evals=1))  # scaled back within the job's own Workload: the slice goes
    assert ("Workload", "team", "rljob-cartpole-eval") not in kube.objects


def test_an_evicted_workload_is_released_only_once_every_pod_is_gone() -> None:
    g, kube = gate()
    g.admission(job())
    kube.admit("rljob-cartpole")
    kube.evict("rljob-cartpole")
    assert g.admission(job()).state is QueueState.PREEMPTED
    assert g.settle(job(), pods_left=2, outcome=None, now=NOW) is None
    assert g.settle(job(), pods_left=0, outcome=None, now=NOW) is not None
    status = kube.objects[("Workload", "team", "rljob-cartpole")]["status"]
    assert status["admission"] is None
    assert g.admission(job()).has_reservation is False


def test_a_finished_job_marks_its_workload_finished() -> None:
    g, kube = gate()
    g.admission(job())
    kube.admit("rljob-cartpole")
    g.settle(job(), pods_left=-1, outcome=(True, "Complete"), now=NOW)
    assert g.admission(job()).state is QueueState.FINISHED


def test_an_evicted_eval_slice_shrinks_the_eval_side_and_is_released_once_its_pods_are_gone() -> None:
    g, kube = gate()
    g.admission(job())
    kube.admit("rljob-cartpole")
    g.admission(job(evals=3))
    kube.admit("rljob-cartpole-eval")
    assert g.admission(job(evals=3)).counts["eval"] == 3
    kube.evict("rljob-cartpole-eval")
    shrunk = g.admission(job(evals=3))
    assert shrunk.runs  # the job keeps training
    assert shrunk.counts["eval"] == 1
    assert shrunk.eval_slice is not None
    assert shrunk.eval_slice.state is QueueState.PREEMPTED
    assert g.release_eval_slice(job(evals=3), eval_pods=3, base_eval=1, now=NOW) is None
    assert g.release_eval_slice(job(evals=3), eval_pods=1, base_eval=1, now=NOW) is not None
    assert kube.objects[("Workload", "team", "rljob-cartpole-eval")]["status"]["admission"] is None

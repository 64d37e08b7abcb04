"""The reconciler with a fake API: what each handler applies, and what a status refresh decides."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rlkube.run_policy import PodRestarts
from rlkube_operator.kube import ApiError
from rlkube_operator.reconcile import ReconcileError, Reconciler
from rlkube_operator.settings import OperatorSettings
from rlkube_operator.status import CoordinatorReport

from tests.conftest import MINIMAL_JOB

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FakeKube:
    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.objects = objects or {}
        self.pods: list[dict[str, Any]] = []
        self.fail_with: ApiError | None = None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.fail_with:
            raise self.fail_with
        self.applied.append(obj)
        return obj

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def list(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str
    ) -> list[dict[str, Any]]:
        return self.pods

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.deleted.append((kind, name))
        return True


def body(**spec: Any) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"].update({"namespace": "ns", "uid": "u1", "generation": 1})
    document["spec"].update(spec)
    return document


def sts(replicas: int, ready: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": ready}}


def reconciler(kube: FakeKube, report: CoordinatorReport | None = None) -> Reconciler:
    return Reconciler(
        kube=kube, settings=OperatorSettings(), ask_coordinator=lambda target, timeout, token: report
    )


def test_reconcile_applies_every_object_in_order() -> None:
    kube = FakeKube()
    outcome = reconciler(kube).reconcile(body(), now=NOW)
    assert [o["kind"] for o in kube.applied] == [
        "Secret",
        "ConfigMap",
        "Service",
        "Service",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
        "StatefulSet",
    ]
    assert outcome.events[0].reason == "Applied"
    assert outcome.status_patch is None


def test_scale_applies_only_the_eval_statefulset() -> None:
    kube = FakeKube()
    reconciler(kube).scale(body(evaluator={"replicas": 5}), now=NOW)
    assert [(o["kind"], o["metadata"]["name"], o["spec"]["replicas"]) for o in kube.applied] == [
        ("StatefulSet", "cartpole-eval", 5)
    ]


def test_a_suspended_job_is_applied_at_zero_and_not_scaled() -> None:
    kube = FakeKube()
    job = body(runPolicy={"suspend": True}, evaluator={"replicas": 4})
    reconciler(kube).reconcile(job, now=NOW)
    assert {o["spec"]["replicas"] for o in kube.applied if o["kind"] == "StatefulSet"} == {0}
    kube.applied.clear()
    reconciler(kube).scale(job, now=NOW)
    assert kube.applied == []


def test_an_invalid_spec_fails_without_applying_anything() -> None:
    kube = FakeKube()
    outcome = reconciler(kube).reconcile(body(train={"batchSize": 9999, "stepsPerEpoch": 10}), now=NOW)
    assert kube.applied == []
    assert outcome.status_patch is not None
    assert outcome.status_patch["phase"] == "Failed"
    assert outcome.events[0].reason == "InvalidSpec"
    assert "spec.train.batchSize" in outcome.events[0].message


def test_an_invalid_spec_already_reported_is_not_patched_again() -> None:
    kube = FakeKube()
    job = body(train={"batchSize": 9999, "stepsPerEpoch": 10})
    first = reconciler(kube).refresh(job, now=NOW)
    job["status"] = first.status_patch
    again = reconciler(kube).refresh(job, now=NOW + timedelta(seconds=5))
    assert again.status_patch is None
    assert again.events == []


@pytest.mark.parametrize(("status", "retryable"), [(409, True), (503, True), (422, False), (403, False)])
def test_api_errors_become_reconcile_errors_that_say_whether_to_retry(status: int, retryable: bool) -> None:
    kube = FakeKube()
    kube.fail_with = ApiError(status, "Why", "because")
    with pytest.raises(ReconcileError) as caught:
        reconciler(kube).reconcile(body(), now=NOW)
    assert caught.value.retryable is retryable
    assert "Secret cartpole-credential" in str(caught.value)  # the first object it applies


def test_refresh_reports_progress_and_transitions() -> None:
    kube = FakeKube(
        {("StatefulSet", "cartpole-train"): sts(1, 1), ("StatefulSet", "cartpole-eval"): sts(1, 1)}
    )
    report = CoordinatorReport(phase="Running", epoch=2, max_epochs=5)
    outcome = reconciler(kube, report).refresh(body(), now=NOW)
    assert outcome.status_patch is not None
    assert outcome.status_patch["phase"] == "Running"
    assert {e.reason for e in outcome.events} >= {"AllTrainRanksReady", "Training"}


def test_refresh_does_not_ask_a_coordinator_that_has_no_statefulset() -> None:
    asked = []
    kube = FakeKube()
    rec = Reconciler(
        kube=kube, settings=OperatorSettings(), ask_coordinator=lambda t, timeout, token: asked.append(t)
    )
    rec.refresh(body(), now=NOW)
    assert asked == []


def test_completion_scales_both_statefulsets_to_zero_once() -> None:
    kube = FakeKube(
        {("StatefulSet", "cartpole-train"): sts(1, 1), ("StatefulSet", "cartpole-eval"): sts(1, 1)}
    )
    done = CoordinatorReport(phase="Complete", finished=True, epoch=5, max_epochs=5)
    outcome = reconciler(kube, done).refresh(body(), now=NOW)
    assert [(o["metadata"]["name"], o["spec"]["replicas"]) for o in kube.applied] == [
        ("cartpole-train", 0),
        ("cartpole-eval", 0),
    ]
    assert "ScaledDown" in [e.reason for e in outcome.events]
    job = body()
    job["status"] = outcome.status_patch
    kube.applied.clear()
    reconciler(kube, None).refresh(job, now=NOW + timedelta(seconds=5))
    assert kube.applied == []


def test_clean_pod_policy_none_leaves_the_pods() -> None:
    kube = FakeKube(
        {("StatefulSet", "cartpole-train"): sts(1, 1), ("StatefulSet", "cartpole-eval"): sts(1, 1)}
    )
    done = CoordinatorReport(phase="Complete", finished=True)
    reconciler(kube, done).refresh(body(runPolicy={"cleanPodPolicy": "None"}), now=NOW)
    assert kube.applied == []


def test_the_ttl_deletes_a_finished_job_when_it_runs_out() -> None:
    kube = FakeKube()
    job = body(runPolicy={"ttlSecondsAfterFinished": 60})
    done = CoordinatorReport(phase="Complete", finished=True)
    kube.objects[("StatefulSet", "cartpole-train")] = sts(1, 1)
    first = reconciler(kube, done).refresh(job, now=NOW)
    job["status"] = first.status_patch
    reconciler(kube).refresh(job, now=NOW + timedelta(seconds=30))
    assert kube.deleted == []
    outcome = reconciler(kube).refresh(job, now=NOW + timedelta(seconds=61))
    assert kube.deleted == [("RLJob", "cartpole")]
    assert outcome.deleted


def test_a_completion_is_stamped_when_the_coordinator_said_so_not_when_the_refresh_began() -> None:
    # Asking the coordinator takes time (here 3 s of a fake clock): a completionTime taken before
    # asking would predate the report, and a TTL counted from it would run out that much early.
    clock = [NOW]

    def slow_coordinator(target: str, timeout: float, token: str | None) -> CoordinatorReport:
        clock[0] += timedelta(seconds=3)
        return CoordinatorReport(phase="Complete", finished=True)

    kube = FakeKube({("StatefulSet", "cartpole-train"): sts(1, 1)})
    job = body(runPolicy={"ttlSecondsAfterFinished": 5})
    rec = Reconciler(
        kube=kube, settings=OperatorSettings(), ask_coordinator=slow_coordinator, clock=lambda: clock[0]
    )
    first = rec.refresh(job)
    assert first.status_patch["completionTime"] == "2026-01-01T00:00:03Z"
    job["status"] = first.status_patch
    clock[0] = NOW + timedelta(seconds=7)  # 4 s after the report: the TTL of 5 s has not run out
    assert not rec.refresh(job).deleted
    clock[0] = NOW + timedelta(seconds=8)
    assert rec.refresh(job).deleted


def test_train_restarts_are_read_from_container_statuses() -> None:
    kube = FakeKube({("StatefulSet", "cartpole-train"): sts(1, 1)})
    kube.pods = [
        {
            "metadata": {"uid": "p1", "name": "cartpole-train-1"},
            "status": {"containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]},
        }
    ]
    children = reconciler(kube).observe(reconciler(kube)._parse(body(), now=NOW)[0])  # type: ignore[arg-type]
    assert dict(children.train_pod_restarts) == {"p1": PodRestarts(rank=1, count=3)}

"""derive_status: observed children + the coordinator's report -> phase, conditions and progress."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rlkube.run_policy import PodRestarts
from rlkube.spec import parse_job
from rlkube_operator.status import (
    Children,
    CoordinatorReport,
    NodeReport,
    RoleObservation,
    derive_status,
    invalid_spec_status,
    status_changed,
)

from tests.conftest import MINIMAL_JOB

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
READY = Children(
    train=RoleObservation(exists=True, desired=2, current=2, ready=2),
    eval=RoleObservation(exists=True, desired=3, current=3, ready=3),
)
RUNNING = CoordinatorReport(
    phase="Running",
    epoch=4,
    max_epochs=10,
    env_steps=8192,
    episodes=40,
    last_return=123.456,
    weight_version=4,
    last_sync_time=T0.timestamp(),
    nodes=(NodeReport("node-b", 3, 1, 2), NodeReport("node-a", 4, 0, 1)),
)


def job(status: dict[str, Any] | None = None, generation: int = 1, **spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"]["generation"] = generation
    document["spec"].update({"trainer": {"replicas": 2}, "evaluator": {"replicas": 3}})
    document["spec"].update(spec)
    if status is not None:
        document["status"] = status
    return parse_job(document)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def step(
    previous: dict[str, Any] | None,
    children: Children,
    report: CoordinatorReport | None,
    *,
    at: datetime,
    **spec: Any,
):
    return derive_status(job(previous, **spec), children, report, now=at)


def test_a_new_job_is_pending_with_every_condition_false() -> None:
    derived = step(None, Children(), None, at=T0)
    status = derived.status
    assert status["phase"] == "Pending"
    assert [c["type"] for c in status["conditions"]] == [
        "Suspended",
        "TrainReady",
        "EvalAvailable",
        "Running",
        "Restarting",
        "Complete",
        "Failed",
    ]
    assert all(c["status"] == "False" for c in status["conditions"])
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])
    assert status["train"]["ready"] == "0/2"
    assert status["eval"]["ready"] == "0/3"


def test_ready_children_and_a_running_coordinator_mean_running_with_progress() -> None:
    status = step(None, READY, RUNNING, at=T0).status
    assert status["phase"] == "Running"
    got = conditions(status)
    assert got["TrainReady"]["status"] == "True"
    assert got["TrainReady"]["reason"] == "AllTrainRanksReady"
    assert got["EvalAvailable"]["status"] == "True"
    assert got["Running"]["reason"] == "Training"
    assert got["Running"]["message"] == "epoch 4/10"
    progress = status["progress"]
    assert progress["epoch"] == 4
    assert progress["weightVersion"] == 4
    assert progress["lastReturn"] == 123.456
    assert progress["lastSyncTime"] == "2026-01-01T12:00:00Z"
    assert [n["nodeName"] for n in progress["nodes"]] == ["node-a", "node-b"]
    assert progress["maxWeightLag"] == 1
    assert status["train"]["ready"] == "2/2"
    assert status["eval"]["ready"] == "3/3"


def test_ready_pods_without_a_report_wait_for_the_coordinator() -> None:
    status = step(None, READY, None, at=T0).status
    assert status["phase"] == "Pending"
    assert conditions(status)["Running"]["reason"] == "WaitingForCoordinator"


def test_the_eval_selector_is_published_for_the_scale_subresource() -> None:
    status = step(None, READY, None, at=T0).status
    assert status["eval"]["selector"] == "rlkube.io/job-name=cartpole,rlkube.io/role=eval"
    assert status["eval"]["replicas"] == 3


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    first = step(None, READY, RUNNING, at=T0).status
    later = step(first, READY, RUNNING, at=T0 + timedelta(minutes=5)).status
    assert later == first
    assert not status_changed(first, later)
    flipped = step(later, Children(train=READY.train), RUNNING, at=T0 + timedelta(minutes=6)).status
    old, new = conditions(later), conditions(flipped)
    assert new["EvalAvailable"]["lastTransitionTime"] == "2026-01-01T12:06:00Z"
    assert new["TrainReady"]["lastTransitionTime"] == old["TrainReady"]["lastTransitionTime"]


def test_observed_generation_follows_the_spec_generation() -> None:
    derived = derive_status(job(None, generation=7), READY, RUNNING, now=T0)
    assert derived.status["observedGeneration"] == 7
    assert {c["observedGeneration"] for c in derived.status["conditions"]} == {7}


def test_only_new_progress_is_a_change_worth_a_patch() -> None:
    first = step(None, READY, RUNNING, at=T0).status
    newer = step(first, READY, CoordinatorReport(**{**RUNNING.__dict__, "epoch": 5}), at=T0).status
    assert status_changed(first, newer)


def test_finished_report_completes_the_job_and_keeps_the_final_figures() -> None:
    running = step(None, READY, RUNNING, at=T0).status
    done_report = CoordinatorReport(
        **{**RUNNING.__dict__, "epoch": 10, "finished": True, "phase": "Complete"}
    )
    derived = step(running, READY, done_report, at=T0 + timedelta(minutes=1))
    status = derived.status
    assert status["phase"] == "Complete"
    assert conditions(status)["Complete"] == {
        "type": "Complete",
        "status": "True",
        "reason": "TrainingFinished",
        "message": "trained 10 epochs, 8192 env steps, last return 123.5",
        "lastTransitionTime": "2026-01-01T12:01:00Z",
        "observedGeneration": 1,
    }
    assert conditions(status)["Running"]["status"] == "False"
    assert status["completionTime"] == "2026-01-01T12:01:00Z"
    assert ("TrainingFinished", False) in [(t.reason, t.warning) for t in derived.transitions]
    # Pods scaled away and the coordinator gone: still Complete, figures kept.
    after = step(status, Children(), None, at=T0 + timedelta(minutes=2)).status
    assert after["phase"] == "Complete"
    assert after["progress"]["epoch"] == 10
    assert after["completionTime"] == status["completionTime"]


def test_restarts_beyond_the_backoff_limit_fail_the_job() -> None:
    first = step(None, READY, RUNNING, at=T0, runPolicy={"backoffLimit": 2}).status
    pods = {"a": PodRestarts(0, 1), "b": PodRestarts(1, 0)}
    second = derive_status(
        job(first, runPolicy={"backoffLimit": 2}),
        Children(train=RoleObservation(True, 2, 2, 1), eval=READY.eval, train_pod_restarts=pods),
        RUNNING,
        now=T0 + timedelta(seconds=10),
    )
    assert second.status["phase"] == "Restarting"
    assert conditions(second.status)["Restarting"]["reason"] == "TrainPodRestarted"
    assert any(t.warning and t.reason == "TrainPodRestarted" for t in second.transitions)
    third = derive_status(
        job(second.status, runPolicy={"backoffLimit": 2}),
        Children(
            train=READY.train,
            eval=READY.eval,
            train_pod_restarts={"a": PodRestarts(0, 3), "b": PodRestarts(1, 0)},
        ),
        RUNNING,
        now=T0 + timedelta(seconds=20),
    )
    failed = conditions(third.status)["Failed"]
    assert third.status["phase"] == "Failed"
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "3 times" in failed["message"]
    assert "backoffLimit 2" in failed["message"]
    assert third.status["train"]["restarts"] == 3


def test_restarts_of_pods_that_were_replaced_are_still_counted() -> None:
    status = step(None, READY, RUNNING, at=T0).status
    status = derive_status(
        job(status), Children(READY.train, READY.eval, {"a": PodRestarts(0, 2)}), RUNNING, now=T0
    ).status
    status = derive_status(
        job(status), Children(READY.train, READY.eval, {"a2": PodRestarts(0, 1)}), RUNNING, now=T0
    ).status
    assert status["train"]["restarts"] == 3


def test_restarting_clears_once_all_train_ranks_are_ready_again() -> None:
    first = step(None, READY, RUNNING, at=T0).status
    restarted = derive_status(
        job(first),
        Children(RoleObservation(True, 2, 2, 1), READY.eval, {"a": PodRestarts(0, 1)}),
        RUNNING,
        now=T0,
    ).status
    still = derive_status(
        job(restarted),
        Children(RoleObservation(True, 2, 2, 1), READY.eval, {"a": PodRestarts(0, 1)}),
        RUNNING,
        now=T0,
    ).status
    assert still["phase"] == "Restarting"
    recovered = derive_status(
        job(still), Children(READY.train, READY.eval, {"a": PodRestarts(0, 1)}), RUNNING, now=T0
    )
    assert recovered.status["phase"] == "Running"
    assert conditions(recovered.status)["Restarting"]["reason"] == "Recovered"


def test_suspend_and_resume() -> None:
    running = step(None, READY, RUNNING, at=T0).status
    suspended = step(running, Children(), None, at=T0 + timedelta(minutes=1), runPolicy={"suspend": True})
    assert suspended.status["phase"] == "Suspended"
    assert conditions(suspended.status)["Suspended"]["reason"] == "JobSuspended"
    assert conditions(suspended.status)["Running"]["reason"] == "JobSuspended"
    resumed = step(suspended.status, Children(), None, at=T0 + timedelta(minutes=3))
    assert resumed.status["phase"] == "Pending"
    assert conditions(resumed.status)["Suspended"]["reason"] == "JobResumed"
    assert resumed.status["startTime"] == "2026-01-01T12:03:00Z"  # the deadline clock restarts
    assert "JobResumed" in [t.reason for t in resumed.transitions]


def test_active_deadline_fails_the_job() -> None:
    first = step(None, READY, RUNNING, at=T0, runPolicy={"activeDeadlineSeconds": 60}).status
    late = step(
        first, READY, RUNNING, at=T0 + timedelta(seconds=61), runPolicy={"activeDeadlineSeconds": 60}
    ).status
    assert late["phase"] == "Failed"
    assert conditions(late)["Failed"]["reason"] == "DeadlineExceeded"


def test_a_failure_reported_by_the_coordinator_fails_the_job() -> None:
    report = CoordinatorReport(phase="Failed", message="policy raised ValueError")
    status = step(None, READY, report, at=T0).status
    assert status["phase"] == "Failed"
    assert conditions(status)["Failed"]["reason"] == "TrainingFailed"
    assert status["message"] == "policy raised ValueError"


@pytest.mark.parametrize(
    ("failure_reason", "message", "reason"),
    [
        ("NonFiniteWeights", "after epoch 4 parameter pi.weight holds NaN or Inf", "NonFiniteWeights"),
        ("TrainingFailed", "NonFiniteWeights is only what the message says", "TrainingFailed"),
    ],
    ids=["named-cause", "message-not-read"],
)
def test_the_coordinators_failure_reason_is_the_failed_reason_and_its_message_is_never_parsed(
    failure_reason: str, message: str, reason: str
) -> None:
    report = CoordinatorReport(phase="Failed", message=message, failure_reason=failure_reason)  # type: ignore[arg-type]
    status = step(None, READY, report, at=T0).status
    assert (conditions(status)["Failed"]["reason"], status["message"]) == (reason, message)


def test_failed_is_final_even_when_the_children_look_healthy_again() -> None:
    failed = step(None, READY, CoordinatorReport(phase="Failed", message="x"), at=T0).status
    again = step(failed, READY, RUNNING, at=T0 + timedelta(minutes=1)).status
    assert again["phase"] == "Failed"
    assert (
        conditions(again)["Failed"]["lastTransitionTime"]
        == conditions(failed)["Failed"]["lastTransitionTime"]
    )


def test_eval_scaled_to_zero_is_named() -> None:
    status = step(None, Children(train=READY.train), RUNNING, at=T0, evaluator={"replicas": 0}).status
    assert conditions(status)["EvalAvailable"]["reason"] == "EvalScaledToZero"


def test_invalid_spec_fails_with_the_field_path() -> None:
    derived = invalid_spec_status(
        None, ["spec.train.batchSize: got 4096, expected at most 2048"], generation=2, now=T0
    )
    status = derived.status
    assert status["phase"] == "Failed"
    failed = conditions(status)["Failed"]
    assert failed["reason"] == "InvalidSpec"
    assert "spec.train.batchSize" in failed["message"]
    assert failed["observedGeneration"] == 2
    assert derived.transitions[0].warning


@pytest.mark.parametrize("phase", ["Complete", "Failed"])
def test_terminal_phases_say_so(phase: str) -> None:
    from rlkube_operator.status import Phase

    assert Phase(phase).is_terminal()
    assert not Phase.RUNNING.is_terminal()


def test_the_status_validates_against_the_crd_schema() -> None:
    import jsonschema
    from rlkube_operator.crd import build_crd

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    for status in (
        step(None, READY, RUNNING, at=T0).status,
        invalid_spec_status(None, ["x"], generation=1, now=T0).status,
    ):
        jsonschema.Draft4Validator(schema).validate(status)


def merge_patch(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) applied as the API server applies one."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def test_status_patch_turns_the_old_status_into_the_new_one() -> None:
    from rlkube_operator.status import status_patch

    old = step(None, READY, RUNNING, at=T0).status
    old["progress"]["evalReturn"] = 5.0
    new = step(
        old, Children(), CoordinatorReport(phase="Running", epoch=5), at=T0 + timedelta(minutes=1)
    ).status
    patch = status_patch(old, new)
    assert patch["progress"]["evalReturn"] is None
    assert merge_patch(old, patch) == new
    assert status_patch(new, new) == {}


def test_a_restarted_coordinator_that_has_not_resumed_yet_keeps_the_last_progress() -> None:
    running = step(None, READY, RUNNING, at=T0).status
    starting = CoordinatorReport(phase="Starting", epoch=0, max_epochs=10, env_steps=0, weight_version=0)
    restarted = step(running, READY, starting, at=T0 + timedelta(seconds=10)).status
    assert restarted["progress"]["epoch"] == 4
    assert restarted["progress"]["lastReturn"] == 123.456

"""derive_status and pod failures: a permanent one fails the job at once with its reason, the others go
through backoff; the newest stays in status; a fixed spec starts again; restarts for a spec change."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from rlkube.run_policy import PodRestarts
from rlkube.spec import parse_job
from rlkube_operator.status import (
    Children,
    CoordinatorReport,
    PodFailure,
    RoleObservation,
    derive_status,
    invalid_spec_status,
    next_decision,
    spec_change_status,
)

from tests.conftest import MINIMAL_JOB

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
STARTING = Children(
    train=RoleObservation(exists=True, desired=1, current=1, ready=0),
    eval=RoleObservation(exists=True, desired=1, current=1, ready=0),
)
READY = Children(
    train=RoleObservation(exists=True, desired=1, current=1, ready=1),
    eval=RoleObservation(exists=True, desired=1, current=1, ready=1),
)
TRAINING = CoordinatorReport(phase="Running", epoch=2, max_epochs=10)
NOT_REGISTERED = PodFailure(
    pod="j-train-0",
    reason="PolicyNotRegistered",
    message="spec.policy.type: no policy named 'PPO2' is registered; did you mean 'PPO'?",
    permanent=True,
    finished_at="2026-01-01T12:00:05Z",
)
CRASH = PodFailure(
    "j-train-0", "PolicyError", "ZeroDivisionError: in my policy", False, 1, "2026-01-01T12:00:09Z"
)


def job(status: dict[str, Any] | None = None, generation: int = 1, **spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"]["generation"] = generation
    document["spec"].update({"trainer": {"replicas": 1}, "evaluator": {"replicas": 1}, **spec})
    if status is not None:
        document["status"] = status
    return parse_job(document)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_a_permanent_pod_failure_fails_the_job_at_once_with_its_reason_and_message() -> None:
    failing = Children(train=STARTING.train, eval=STARTING.eval, failures=(NOT_REGISTERED,))
    derived = derive_status(job(), failing, None, now=T0)
    assert derived.status["phase"] == "Failed"
    failed = condition(derived.status, "Failed")
    assert failed["reason"] == "PolicyNotRegistered"
    assert "no policy named 'PPO2'" in failed["message"]
    assert derived.status["train"]["restarts"] == 0  # no backoff was spent
    assert derived.status["lastFailure"]["reason"] == "PolicyNotRegistered"
    assert any(t.reason == "PolicyNotRegistered" and t.warning for t in derived.transitions)


def test_a_failure_a_restart_may_fix_goes_through_backoff_and_is_named_when_it_runs_out() -> None:
    once = Children(
        train=STARTING.train,
        eval=STARTING.eval,
        train_pod_restarts={"p": PodRestarts(0, 1)},
        failures=(CRASH,),
    )
    first = derive_status(job(runPolicy={"backoffLimit": 1}), once, None, now=T0)
    assert first.status["phase"] == "Restarting"
    assert first.status["lastFailure"]["message"] == CRASH.message
    twice = Children(
        train=STARTING.train,
        eval=STARTING.eval,
        train_pod_restarts={"p": PodRestarts(0, 2)},
        failures=(CRASH,),
    )
    second = derive_status(
        job(first.status, runPolicy={"backoffLimit": 1}), twice, None, now=T0 + timedelta(seconds=9)
    )
    failed = condition(second.status, "Failed")
    assert (second.status["phase"], failed["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert "last failure: PolicyError: ZeroDivisionError: in my policy" in failed["message"]


def test_the_last_failure_stays_after_the_pods_are_gone() -> None:
    failing = Children(train=STARTING.train, eval=STARTING.eval, failures=(NOT_REGISTERED,))
    failed = derive_status(job(), failing, None, now=T0)
    cleaned = derive_status(job(failed.status), Children(), None, now=T0 + timedelta(seconds=30))
    assert cleaned.status["lastFailure"] == failed.status["lastFailure"]
    assert condition(cleaned.status, "Failed")["reason"] == "PolicyNotRegistered"


def test_a_new_generation_of_a_job_failed_for_its_spec_is_derived_from_scratch() -> None:
    failing = Children(train=STARTING.train, eval=STARTING.eval, failures=(NOT_REGISTERED,))
    failed = derive_status(job(), failing, None, now=T0)
    fixed = derive_status(job(failed.status, generation=2), READY, TRAINING, now=T0 + timedelta(seconds=60))
    assert fixed.status["phase"] == "Running"
    assert fixed.status["observedGeneration"] == 2
    assert condition(fixed.status, "Failed")["status"] == "False"
    assert "lastFailure" not in fixed.status


def test_a_new_generation_of_an_invalid_spec_says_the_new_problem() -> None:
    first = invalid_spec_status(None, ["spec.train.batchSize: too big"], generation=1, now=T0)
    second = invalid_spec_status(first.status, ["spec.env.numEnvs: too many"], generation=2, now=T0)
    assert second.status["message"] == "spec.env.numEnvs: too many"
    assert second.status["observedGeneration"] == 2
    valid = derive_status(job(second.status, generation=3), READY, TRAINING, now=T0 + timedelta(seconds=5))
    assert valid.status["phase"] == "Running"


def test_a_job_failed_by_its_backoff_stays_failed_in_a_new_generation() -> None:
    flaky = Children(train=STARTING.train, eval=STARTING.eval, train_pod_restarts={"p": PodRestarts(0, 9)})
    failed = derive_status(job(), flaky, None, now=T0)
    assert condition(failed.status, "Failed")["reason"] == "BackoffLimitExceeded"
    later = derive_status(job(failed.status, generation=2), READY, TRAINING, now=T0 + timedelta(seconds=5))
    assert later.status["phase"] == "Failed"


def test_a_spec_change_keeps_restarting_until_the_train_ranks_run_the_new_spec() -> None:
    running = derive_status(job(), READY, TRAINING, now=T0)
    changed = spec_change_status(running.status, ["spec.train.maxEpochs"], generation=2, now=T0)
    restarting = condition(changed.status, "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("True", "SpecChanged")
    assert "spec.train.maxEpochs" in restarting["message"]
    old_pods_ready = Children(train=READY.train, eval=READY.eval, train_current_ready=0)
    rolling = derive_status(
        job(changed.status, generation=2), old_pods_ready, TRAINING, now=T0 + timedelta(seconds=1)
    )
    assert condition(rolling.status, "Restarting")["reason"] == "SpecChanged"
    assert rolling.status["phase"] == "Restarting"
    new_pods_ready = Children(train=READY.train, eval=READY.eval, train_current_ready=1)
    done = derive_status(
        job(rolling.status, generation=2), new_pods_ready, TRAINING, now=T0 + timedelta(seconds=9)
    )
    assert condition(done.status, "Restarting")["status"] == "False"
    assert done.status["phase"] == "Running"


def test_the_next_decision_is_the_ttl_of_a_finished_job_or_the_deadline_of_a_running_one() -> None:
    done = CoordinatorReport(phase="Complete", finished=True)
    finished = derive_status(job(runPolicy={"ttlSecondsAfterFinished": 5}), READY, done, now=T0)
    assert next_decision(job(finished.status, runPolicy={"ttlSecondsAfterFinished": 5})) == T0 + timedelta(
        seconds=5
    )
    running = derive_status(job(runPolicy={"activeDeadlineSeconds": 60}), READY, TRAINING, now=T0)
    assert next_decision(job(running.status, runPolicy={"activeDeadlineSeconds": 60})) == T0 + timedelta(
        seconds=60
    )
    assert next_decision(job(running.status)) is None


EVAL_CRASH = PodFailure(
    "j-eval-0",
    "PolicyError",
    "RuntimeError: rollout_step broke\n  in rollout_step (my.py:3)",
    False,
    1,
    "2026-01-01T12:00:20Z",
)


def test_an_eval_worker_restarting_past_eval_backoff_limit_fails_the_job_with_its_error() -> None:
    status = derive_status(job(runPolicy={"evalBackoffLimit": 2}), READY, TRAINING, now=T0).status
    for count, moment in ((1, 10), (2, 20)):
        crashing = Children(
            train=READY.train,
            eval=READY.eval,
            eval_pod_restarts={"e0": PodRestarts(0, count), "e1": PodRestarts(1, 0)},
            failures=(EVAL_CRASH,),
        )
        at = T0 + timedelta(seconds=moment)
        status = derive_status(
            job(status, runPolicy={"evalBackoffLimit": 2}), crashing, TRAINING, now=at
        ).status
        assert status["phase"] == "Running"  # an eval restart never restarts training
        assert status["eval"]["restarts"] == count
    third = Children(
        train=READY.train,
        eval=READY.eval,
        eval_pod_restarts={"e0b": PodRestarts(0, 1), "e1": PodRestarts(1, 0)},  # the pod was replaced
        failures=(EVAL_CRASH,),
    )
    failed = derive_status(
        job(status, runPolicy={"evalBackoffLimit": 2}), third, TRAINING, now=T0 + timedelta(seconds=30)
    ).status
    assert failed["phase"] == "Failed"
    reason = condition(failed, "Failed")
    assert reason["reason"] == "EvalBackoffLimitExceeded"
    expected = "eval worker cartpole-eval-0 restarted 3 times, more than runPolicy.evalBackoffLimit 2"
    assert expected in reason["message"]
    assert "RuntimeError: rollout_step broke" in reason["message"]  # the policy's error, not just a count
    assert failed["train"]["restarts"] == 0

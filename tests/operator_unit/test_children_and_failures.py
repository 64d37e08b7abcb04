"""The reconciler's level-triggered side with a fake API: what a pod's termination message becomes,
when a child is restored, and when a spec change is announced as restarting training."""

from __future__ import annotations

from typing import Any

import pytest
from rlkube.contract import TERMINATION_MESSAGE_MAX_BYTES, parse_termination_message, termination_message
from rlkube_operator.compare import changed_fields, drift
from rlkube_operator.reconcile import pod_failures
from rlkube_operator.render import render

from tests.operator_unit.test_reconciler import NOW, FakeKube, body, reconciler, sts


def pod(terminated: dict[str, Any], *, where: str = "lastState") -> dict[str, Any]:
    status = {"restartCount": 1, where: {"terminated": terminated}}
    return {"metadata": {"name": "cartpole-train-0", "uid": "p1"}, "status": {"containerStatuses": [status]}}


def test_a_termination_message_round_trips_and_stays_within_the_kubelets_limit() -> None:
    text = termination_message("EnvNotFound", "spec.env.id: " + "x" * 10_000).encode()
    assert len(text.encode()) <= TERMINATION_MESSAGE_MAX_BYTES
    parsed = parse_termination_message(text)
    assert parsed is not None
    assert (parsed.reason, parsed.permanent) == ("EnvNotFound", True)
    assert parsed.message.startswith("spec.env.id: xxx")
    assert parse_termination_message("Traceback (most recent call last): ...") is None


def test_a_pods_structured_message_is_its_failure() -> None:
    message = termination_message("PolicyNotRegistered", "no policy named 'PPO2'").encode()
    [failure] = pod_failures(pod({"exitCode": 2, "message": message, "finishedAt": "2026-01-01T00:00:01Z"}))
    assert (failure.reason, failure.permanent, failure.exit_code) == ("PolicyNotRegistered", True, 2)
    assert failure.message == "no policy named 'PPO2'"
    assert failure.pod == "cartpole-train-0"


@pytest.mark.parametrize(
    ("terminated", "reason"),
    [
        ({"exitCode": 1, "reason": "Error", "message": "Traceback ...\nValueError: boom"}, "Error"),
        ({"exitCode": 137, "reason": "OOMKilled"}, "OOMKilled"),
    ],
)
def test_an_unstructured_failure_may_be_fixed_by_a_restart(terminated: dict[str, Any], reason: str) -> None:
    [failure] = pod_failures(pod(terminated))
    assert (failure.reason, failure.permanent) == (reason, False)


@pytest.mark.parametrize("code", [0, 143])
def test_a_clean_or_sigterm_exit_without_a_message_is_no_failure(code: int) -> None:
    assert pod_failures(pod({"exitCode": code, "reason": "Completed"}, where="state")) == []


def test_a_failure_of_a_pod_of_the_previous_spec_is_ignored() -> None:
    kube = FakeKube({("StatefulSet", "cartpole-train"): sts(1, 0)})
    failed = pod({"exitCode": 2, "message": termination_message("EnvNotFound", "old").encode()})
    failed["metadata"]["annotations"] = {"rlkube.io/spec-hash": "not-the-current-one"}
    kube.pods = [failed]
    outcome = reconciler(kube).refresh(body(), now=NOW)
    assert outcome.status_patch is not None
    assert outcome.status_patch["phase"] != "Failed"


def test_a_permanent_failure_read_from_the_pods_fails_the_job() -> None:
    kube = FakeKube({("StatefulSet", "cartpole-train"): sts(1, 0)})
    kube.pods = [
        pod({"exitCode": 2, "message": termination_message("EnvNotFound", "spec.env.id: nope").encode()})
    ]
    outcome = reconciler(kube).refresh(body(), now=NOW)
    assert outcome.status_patch is not None
    assert outcome.status_patch["phase"] == "Failed"
    assert "spec.env.id: nope" in outcome.status_patch["message"]


def test_a_deleted_child_is_applied_again_with_an_event() -> None:
    kube = FakeKube()
    outcome = reconciler(kube).restore(body(), "StatefulSet", "cartpole-eval", None, now=NOW)
    assert [(o["kind"], o["metadata"]["name"]) for o in kube.applied] == [("StatefulSet", "cartpole-eval")]
    assert [(e.reason, e.message) for e in outcome.events] == [
        ("Restored", "StatefulSet cartpole-eval was deleted: restored")
    ]


def test_a_child_that_holds_its_rendering_is_left_alone() -> None:
    kube = FakeKube()
    rec = reconciler(kube)
    live = next(
        o for o in render(rec._parse(body(), now=NOW)[0], rec.settings.render) if o["kind"] == "Service"
    )  # type: ignore[arg-type]
    live = {**live, "status": {"loadBalancer": {}}, "spec": {**live["spec"], "clusterIPs": ["None"]}}
    assert rec.restore(body(), "Service", live["metadata"]["name"], live, now=NOW).events == []
    assert kube.applied == []


def test_a_child_of_a_job_being_deleted_is_not_restored() -> None:
    kube = FakeKube()
    going = body()
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reconciler(kube).restore(going, "ConfigMap", "cartpole-job", None, now=NOW).events == []
    assert kube.applied == []


def test_drift_names_what_changed_and_ignores_what_the_server_added() -> None:
    rendered = {
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"image": "a", "args": ["pod"]}]}}}
    }
    live = {
        "spec": {
            "replicas": 5,
            "revisionHistoryLimit": 10,
            "template": {
                "spec": {"containers": [{"image": "b", "args": ["pod"], "imagePullPolicy": "Always"}]}
            },
        },
        "status": {"replicas": 5},
    }
    assert drift(rendered, live) == ["spec.replicas", "spec.template.spec.containers[0].image"]
    assert (
        drift(
            rendered,
            {**live, "spec": {**live["spec"], "replicas": 2, "template": rendered["spec"]["template"]}},
        )
        == []
    )


def test_changed_fields_lists_every_leaf_that_differs() -> None:
    old = {"train": {"maxEpochs": 5, "seed": 1}, "trainer": {"replicas": 2}}
    new = {"train": {"maxEpochs": 7, "seed": 1}, "trainer": {"replicas": 2, "backend": "gloo"}}
    assert changed_fields(old, new, prefix="spec") == ["spec.train.maxEpochs", "spec.trainer.backend"]


def test_a_change_that_replaces_running_train_pods_is_announced_with_its_fields() -> None:
    kube = FakeKube({("StatefulSet", "cartpole-train"): sts(1, 1)})
    old = {"spec": body()["spec"]}
    outcome = reconciler(kube).reconcile(body(train={"maxEpochs": 9}), now=NOW, old=old)
    said = [e for e in outcome.events if e.reason == "TrainingRestarts"]
    assert said
    assert said[0].type == "Warning"
    assert "spec.train.maxEpochs" in said[0].message
    assert outcome.status_patch is not None
    restarting = next(c for c in outcome.status_patch["conditions"] if c["type"] == "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("True", "SpecChanged")


def test_an_eval_only_change_or_a_job_with_nothing_running_announces_nothing() -> None:
    running = FakeKube({("StatefulSet", "cartpole-train"): sts(1, 1)})
    old = {"spec": body()["spec"]}
    scaled = reconciler(running).reconcile(body(evaluator={"replicas": 7}), now=NOW, old=old)
    assert not [e for e in scaled.events if e.reason == "TrainingRestarts"]
    nothing = reconciler(FakeKube()).reconcile(body(train={"maxEpochs": 9}), now=NOW, old=old)
    assert not [e for e in nothing.events if e.reason == "TrainingRestarts"]

"""A hostile client against a live coordinator: every bad call gets its own answer, and the run is unharmed.

Each test drives the real gRPC server on loopback as an attacker would (with no credential, a
wrong one, or the job's own but acting as someone else), asserts the exact status code, and
where it matters that an honest worker's run still ends with every fragment counted once.
"""

from __future__ import annotations

import math
import threading

import grpc
import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError
from rlkube.coordinator.edge import MAX_REQUEST_BYTES
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.refusals import EVICT_AFTER_REFUSALS
from rlkube.security.credential import Credential, new_token
from tensordict import TensorDict

from tests.security.live import (
    NUM_ENVS,
    STEPS,
    LiveJob,
    code_of,
    live_job,
    push_message,
    register,
    trajectories,
)


def open_epoch_and_lease(live: LiveJob, pod: str = "cartpole-eval-0") -> tuple[str, pb.Task]:
    live.coordinator.open_epoch(epoch=1, version=0)
    with live.client() as client:
        worker_id = register(client, pod)
        task = client.lease(worker_id, wait_seconds=1.0)
    assert task.kind == pb.Task.COLLECT
    return worker_id, task


# Credentials ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "credential", [Credential.open(), Credential.of_token(new_token())], ids=["missing", "wrong"]
)
def test_a_call_without_the_jobs_credential_is_unauthenticated_whatever_it_asks(
    live: LiveJob, credential: Credential
) -> None:
    with live.client(credential) as intruder:
        calls = {
            "GetStatus": lambda: intruder.status(),
            "Register": lambda: register(intruder, "cartpole-eval-0"),
            "PullShard": lambda: intruder.pull_shard(serial=0, rank=0, world_size=1, wait_seconds=0),
            "Deregister": lambda: intruder.deregister("cartpole-eval-0#1", "bye"),
        }
        codes = {name: code_of(call) for name, call in calls.items()}
    assert codes == {name: grpc.StatusCode.UNAUTHENTICATED for name in calls}
    assert len(live.coordinator.members) == 0


def test_an_unauthenticated_oversized_push_is_refused_unparsed(live: LiveJob) -> None:
    worker_id, task = open_epoch_and_lease(live)
    message = push_message(task, worker_id)
    message.batch.payload = b"\0" * (8 << 20)  # would be malformed too: never looked at
    with live.client(Credential.open()) as intruder:
        assert code_of(lambda: intruder.push(message, retry_for=0)) == grpc.StatusCode.UNAUTHENTICATED
    assert live.coordinator.progress.fragments == 0


# Leases -----------------------------------------------------------------------------------------


def test_a_push_from_a_client_that_never_registered_is_permission_denied(live: LiveJob) -> None:
    worker_id, task = open_epoch_and_lease(live)
    with live.client() as client:
        forged = push_message(task, "cartpole-eval-0#1")  # the public name, not the secret id
        assert code_of(lambda: client.push(forged, retry_for=0)) == grpc.StatusCode.PERMISSION_DENIED
        # The lease holder's own push is still the first, and accepted.
        ack = client.push(push_message(task, worker_id), retry_for=0)
    assert ack.accepted
    assert not ack.duplicate


def test_a_push_for_someone_elses_lease_is_permission_denied(live: LiveJob) -> None:
    holder, task = open_epoch_and_lease(live)
    with live.client() as client:
        other = register(client, "cartpole-eval-1")
        stolen = push_message(task, other)
        assert code_of(lambda: client.push(stolen, retry_for=0)) == grpc.StatusCode.PERMISSION_DENIED
        assert client.push(push_message(task, holder), retry_for=0).accepted
        # Nor may another worker push it again once it is in.
        assert code_of(lambda: client.push(stolen, retry_for=0)) == grpc.StatusCode.PERMISSION_DENIED
        # The holder's retry is a duplicate, counted nowhere.
        assert client.push(push_message(task, holder), retry_for=0).duplicate
    assert live.coordinator.progress.fragments == 1


def test_task_and_worker_ids_cannot_be_guessed_from_what_others_see(live: LiveJob) -> None:
    worker_id, task = open_epoch_and_lease(live)
    with live.client() as client:
        status = client.status()
    assert [w.worker_id for w in status.workers] == ["cartpole-eval-0#1"]
    assert worker_id.startswith("cartpole-eval-0#1.")
    assert len(worker_id.rsplit(".", 1)[1]) >= 16
    assert task.task_id.startswith("e1-f")
    assert len(task.task_id.rsplit(".", 1)[1]) >= 12


def test_a_forged_load_report_is_refused_and_a_members_report_counts_once_per_version(
    live: LiveJob,
) -> None:
    incarnation = live.coordinator.incarnation
    live.coordinator.published(version=1, fingerprint={"w": 1.0}, incarnation=incarnation)
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        forged = pb.ReportLoadedRequest(worker_id="cartpole-eval-0#1", incarnation=incarnation, version=1)
        assert code_of(lambda: client.report_loaded(forged)) == grpc.StatusCode.NOT_FOUND
        own = pb.ReportLoadedRequest(worker_id=worker_id, incarnation=incarnation, version=1)
        assert client.report_loaded(own).consistent
        assert code_of(lambda: client.report_loaded(own)) == grpc.StatusCode.PERMISSION_DENIED
        nan = pb.ReportLoadedRequest(
            worker_id=worker_id, incarnation=incarnation, version=2, fingerprint={"w": math.nan}
        )
        assert code_of(lambda: client.report_loaded(nan)) == grpc.StatusCode.INVALID_ARGUMENT
    assert live.coordinator.version_consistency(1) is True


# Malformed fragments ----------------------------------------------------------------------------


def _wrong_keys():  # type: ignore[no-untyped-def]
    data = trajectories()
    return data.select("observation", "action").set("junk", torch.zeros(NUM_ENVS, STEPS))


def _nan_rewards():  # type: ignore[no-untyped-def]
    data = trajectories()
    data["reward"][0, 1] = math.nan
    return data


def _inf_observation():  # type: ignore[no-untyped-def]
    data = trajectories()
    data["observation"][1, 0, 2] = math.inf
    return data


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_wrong_keys, "missing"),
        (_nan_rewards, "reward holds 1 non-finite"),
        (_inf_observation, "observation holds 1 non-finite"),
        (lambda: trajectories(num_envs=NUM_ENVS + 1), "the task asks for"),
        (lambda: trajectories(steps=STEPS + 3), "the task asks for"),
    ],
    ids=["wrong-keys", "nan-reward", "inf-observation", "too-many-envs", "too-many-steps"],
)
def test_a_fragment_the_trainer_cannot_use_is_invalid_argument_with_the_reason(
    live: LiveJob, make, reason: str
) -> None:  # type: ignore[no-untyped-def]
    worker_id, task = open_epoch_and_lease(live)
    with live.client() as client:
        bad = push_message(task, worker_id, make())
        with pytest.raises(CoordinatorError) as refused:
            client.push(bad, retry_for=0)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in str(refused.value)
        # The task went back to the queue: someone (here the same worker) collects it again.
        again = client.lease(worker_id, wait_seconds=1.0)
        assert again.task_id == task.task_id
        assert client.push(push_message(again, worker_id), retry_for=0).accepted
    assert live.coordinator.progress.fragments == 1


def test_a_fragment_whose_leaves_differ_from_the_first_accepted_one_is_invalid(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        first = client.lease(worker_id, wait_seconds=1.0)
        second = client.lease(worker_id, wait_seconds=1.0)
        assert client.push(push_message(first, worker_id), retry_for=0).accepted
        wider = push_message(second, worker_id, trajectories(obs=5))
        code = code_of(lambda: client.push(wider, retry_for=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert live.coordinator.schema is not None


@pytest.mark.parametrize(
    "tamper",
    [
        lambda m: m.batch.tensors[0].shape.__setitem__(0, -2),  # negative dimension
        lambda m: m.batch.tensors[0].shape.__setitem__(2, 7),  # shape that does not fit its bytes
        lambda m: m.batch.tensors[0].shape.__setitem__(0, NUM_ENVS + 1),  # not the batch size
        lambda m: setattr(m.batch.tensors[0], "dtype", "float128"),  # no such dtype
        lambda m: setattr(m.batch.tensors[0], "nbytes", 1 << 62),  # bytes past the payload
        lambda m: m.batch.batch_size.__setitem__(1, -1),  # negative batch size
    ],
    ids=[
        "negative-dim",
        "shape-vs-bytes",
        "shape-vs-batch",
        "unknown-dtype",
        "past-payload",
        "negative-batch",
    ],
)
def test_a_malformed_manifest_is_invalid_argument_never_unknown(live: LiveJob, tamper) -> None:  # type: ignore[no-untyped-def]
    worker_id, task = open_epoch_and_lease(live)
    message = push_message(task, worker_id)
    tamper(message)
    with live.client() as client:
        assert code_of(lambda: client.push(message, retry_for=0)) == grpc.StatusCode.INVALID_ARGUMENT
    assert live.coordinator.progress.fragments == 0


def test_oversize_strings_are_invalid_and_oversize_messages_exhausted(live: LiveJob) -> None:
    with live.client() as client:
        huge_name = pb.RegisterRequest(role="eval", pod_name="p" * 100_000, num_envs=NUM_ENVS)
        assert code_of(lambda: client.register(huge_name, retry_for=0)) == grpc.StatusCode.INVALID_ARGUMENT
        worker_id = register(client, "cartpole-eval-0")
        long_reason = pb.DeregisterRequest(worker_id=worker_id, reason="r" * 10_000)
        assert (
            code_of(lambda: client.stub.Deregister(long_reason, timeout=5))
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        huge = pb.Fragment(
            task_id="t", worker_id=worker_id, batch=pb.TensorBatch(payload=b"\0" * MAX_REQUEST_BYTES)
        )
        assert (
            code_of(lambda: client.stub.PushFragment(huge, timeout=30)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        )
    assert [w.pod_name for w in live.coordinator.members.workers()] == ["cartpole-eval-0"]


# Floods -----------------------------------------------------------------------------------------


def test_a_registration_flood_is_cut_to_the_burst_and_rate(live: LiveJob) -> None:
    codes = []
    with live.client() as client:
        for i in range(300):
            request = pb.RegisterRequest(role="eval", pod_name=f"flood-{i}", num_envs=1)
            codes.append(code_of(lambda r=request: client.stub.Register(r, timeout=5)))
    admitted = codes.count(None)
    gate = live.coordinator.registrations
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 300 - admitted
    assert gate.burst <= admitted < 300
    assert len(live.coordinator.members) == admitted


def test_members_past_the_limit_are_exhausted_but_a_restarted_pod_still_gets_back_in() -> None:
    from tests.security.live import live_job

    for live in live_job(max_members=2):
        with live.client() as client:
            register(client, "cartpole-eval-0")
            register(client, "cartpole-eval-1")
            third = pb.RegisterRequest(role="eval", pod_name="cartpole-eval-2", num_envs=NUM_ENVS)
            assert (
                code_of(lambda r=third: client.stub.Register(r, timeout=5))
                == grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            register(client, "cartpole-eval-1")  # the same pod again replaces itself
        assert len(live.coordinator.members) == 2


# The whole run ----------------------------------------------------------------------------------


def test_a_run_under_attack_still_finishes_with_every_fragment_counted_once(live: LiveJob) -> None:
    epochs = 3
    per_epoch = live.coordinator.fragments_per_epoch
    attacked: set[str] = set()
    attacked_changed = threading.Condition()

    def hold_until_attacked(task: pb.Task) -> None:
        # The honest worker keeps its lease open until both attackers have pushed against it,
        # so every task is attacked while it is live, however the threads are scheduled. If the
        # attack never comes it pushes anyway: the run ends and the last assertion names the gap.
        with attacked_changed:
            attacked_changed.wait_for(lambda: task.task_id in attacked, timeout=30)

    engine = live.run_engine(epochs)
    with live.client() as insider, live.client(Credential.of_token("nope")) as outsider:
        intruder_id = register(insider, "intruder")
        worker, acked = live.honest_worker(before_push=hold_until_attacked)
        while engine.is_alive():
            for task_id, holder in live.coordinator.board.leased().items():
                if task_id in attacked:
                    continue
                task = pb.Task(kind=pb.Task.COLLECT, task_id=task_id, epoch=1)
                for client, worker_id in ((insider, intruder_id), (outsider, holder)):
                    message = push_message(task, worker_id)
                    answer: grpc.StatusCode | pb.PushAck
                    try:
                        answer = client.push(message, retry_for=0)
                    except CoordinatorError as exc:
                        answer = exc.code or grpc.StatusCode.UNKNOWN
                    assert answer in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
                with attacked_changed:
                    attacked.add(task_id)
                    attacked_changed.notify_all()
            engine.join(0.01)
        worker.join(10)
    status = live.coordinator.snapshot
    assert status.phase == "Complete", status.message
    assert [len(batch) for batch in live.batches] == [per_epoch] * epochs
    assert sorted(t for batch in live.batches for t in batch) == sorted(acked)
    assert live.coordinator.progress.fragments == per_epoch * epochs
    assert attacked == set(acked)


# Trajectories against the job's spaces ------------------------------------------------------------


def _action_seven() -> TensorDict:
    data = trajectories()
    data["action"][0, 1] = 7  # CartPole has actions 0 and 1
    return data


def _float64_observation() -> TensorDict:
    data = trajectories()
    data["observation"] = data["observation"].double()
    return data


def _nan_log_prob() -> TensorDict:
    data = trajectories()
    data["log_prob"][1, 2] = math.nan
    return data


def _inf_value() -> TensorDict:
    data = trajectories()
    data["value"] = torch.zeros(NUM_ENVS, STEPS)
    data["value"][0, 0] = math.inf
    return data


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_action_seven, "action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)"),
        (_float64_observation, "observation is float64; the env's observations are float32"),
        (lambda: trajectories(obs=5), "observation has shape [5] per step; the env's observations are [4]"),
        (_nan_log_prob, "log_prob holds 1 non-finite values"),
        (_inf_value, "value holds 1 non-finite values"),
    ],
    ids=["action-7", "float64-observation", "observation-shape", "nan-log-prob", "inf-value"],
)
def test_a_fragment_outside_the_envs_spaces_is_refused_with_the_key_counted_and_never_journalled(
    tmp_path, make, reason: str
) -> None:  # type: ignore[no-untyped-def]
    journal = AckJournal(tmp_path / "acknowledged", incarnation="first").open()
    for live in live_job(journal=journal, incarnation="first"):
        worker_id, task = open_epoch_and_lease(live)
        with live.client() as client:
            with pytest.raises(CoordinatorError) as refused:
                client.push(push_message(task, worker_id, make()), retry_for=0)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert reason in str(refused.value)
            assert journal.held() == {}  # never journalled, never trained
            status = client.status()
            # The task went back to the queue; a well-formed push of it is the first acknowledged.
            again = client.lease(worker_id, wait_seconds=1.0)
            assert client.push(push_message(again, worker_id), retry_for=0).accepted
        assert status.fragments_refused == 1
        assert [w.fragments_refused for w in status.workers] == [1]
        [record] = status.refusals
        assert (record.worker, record.task, record.quarantined, record.evicted) == (
            "cartpole-eval-0#1",
            task.task_id.rsplit(".", 1)[0],
            False,
            False,
        )
        assert reason in record.reason
        assert live.coordinator.progress.fragments == 1
        assert AckJournal(journal.directory, incarnation="reader").open().held() == {1: 1}  # on disk


def test_a_pod_refused_repeatedly_is_evicted_its_lease_reassigned_and_it_may_not_register_again(
    live: LiveJob,
) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    with live.client() as insider, live.client() as honest:
        intruder = register(insider, "intruder")
        codes = []
        for _ in range(EVICT_AFTER_REFUSALS):
            task = insider.lease(intruder, wait_seconds=1.0)
            poison = push_message(task, intruder, _action_seven())
            codes.append(code_of(lambda message=poison: insider.push(message, retry_for=0)))
        assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * EVICT_AFTER_REFUSALS
        # Evicted with the third: its calls are those of a stranger, and its pod may not come back.
        assert code_of(lambda: insider.lease(intruder, wait_seconds=0)) == grpc.StatusCode.NOT_FOUND
        again = pb.RegisterRequest(role="eval", pod_name="intruder", node_name="node-0", num_envs=NUM_ENVS)
        with pytest.raises(CoordinatorError) as barred:
            insider.register(again, retry_for=0)
        assert barred.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "pod intruder was evicted: 3 fragments refused" in str(barred.value)
        # Every task it held is an honest worker's to collect.
        worker_id = register(honest, "cartpole-eval-0")
        for _ in range(live.coordinator.fragments_per_epoch):
            task = honest.lease(worker_id, wait_seconds=1.0)
            assert honest.push(push_message(task, worker_id), retry_for=0).accepted
        status = honest.status()
    assert live.coordinator.buffer.wait_ready(timeout=5)
    assert (status.fragments_refused, status.workers_evicted) == (EVICT_AFTER_REFUSALS, 1)
    assert [r.evicted for r in status.refusals] == [False, False, True]
    assert {r.worker for r in status.refusals} == {"intruder#1"}
    assert [w.pod_name for w in status.workers] == ["cartpole-eval-0"]


def test_a_heartbeat_from_an_unknown_worker_is_not_found_like_a_lease(live: LiveJob) -> None:
    with live.client() as client:
        stranger = pb.HeartbeatRequest(worker_id="cartpole-eval-0#1.guessed")
        assert code_of(lambda: client.heartbeat(stranger)) == grpc.StatusCode.NOT_FOUND
        member = register(client, "cartpole-eval-0")
        assert client.heartbeat(pb.HeartbeatRequest(worker_id=member)).known


def test_a_load_report_of_a_version_never_published_cannot_mark_the_job_consistent(live: LiveJob) -> None:
    incarnation = live.coordinator.incarnation
    live.coordinator.published(version=1, fingerprint={"w": 1.0}, incarnation=incarnation)
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        future = pb.ReportLoadedRequest(worker_id=worker_id, incarnation=incarnation, version=2)
        other = pb.ReportLoadedRequest(worker_id=worker_id, incarnation="another", version=1)
        answers = [client.report_loaded(future), client.report_loaded(other)]
    assert [a.consistent for a in answers] == [False, False]
    assert "never published" in answers[0].detail
    assert live.coordinator.version_consistency(2) is None  # no verdict: the engine's check stays open
    assert live.coordinator.version_consistency(1) is None


def test_differing_from_the_schema_another_worker_set_is_refused_but_never_evicts(live: LiveJob) -> None:
    # The learned schema is the first pusher's word (an insider may have pushed first): a pod whose
    # fragments differ from it is refused each time, but not evicted for it.
    live.coordinator.open_epoch(epoch=1, version=0)
    with live.client() as client:
        first = register(client, "cartpole-eval-0")
        task = client.lease(first, wait_seconds=1.0)
        extra = trajectories()
        extra["junk"] = torch.zeros(NUM_ENVS, STEPS)
        assert client.push(push_message(task, first, extra), retry_for=0).accepted
        other = register(client, "cartpole-eval-1")
        codes = []
        for _ in range(EVICT_AFTER_REFUSALS + 1):
            task = client.lease(other, wait_seconds=1.0)
            message = push_message(task, other)
            codes.append(code_of(lambda message=message: client.push(message, retry_for=0)))
        status = client.status()
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * (EVICT_AFTER_REFUSALS + 1)
    assert (status.fragments_refused, status.workers_evicted) == (EVICT_AFTER_REFUSALS + 1, 0)
    assert "keys differ from the job's" in status.refusals[-1].reason
    assert sorted(w.pod_name for w in status.workers) == ["cartpole-eval-0", "cartpole-eval-1"]

"""A worker's pushes travel on one PushFragments stream, with every answer a unary push would get.

Driven as a worker drives it (``PolicyGroupClient.push``) against the real server: a refused
push is answered with its status and the stream goes on; a rank-0 restart moves the pushes to a
new stream (a resent push is a duplicate); a rotated token opens a new stream and a revoked one
is refused; an older coordinator without the method is pushed to unary. The client's matching of
answers to pushes is checked against a stream that answers out of order, and a stream that never
answers (a connection dead without a word) is given up for a new one, its pushes retried.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import PolicyGroupClient
from rlkube.coordinator.push_stream import PushStream, RpcStatusError
from rlkube.coordinator.service import CoordinatorServer, PolicyGroupServicer, add_policy_group
from rlkube.coordinator.state import Coordinator
from rlkube.security import credential as credential_module
from rlkube.security.credential import Credential, new_token
from rlkube.security.grpc_auth import listen, make_server
from rlkube.spec import parse_job

from tests.security.live import (
    CARTPOLE_SPACES,
    JOB,
    LiveJob,
    code_of,
    live_job,
    push_message,
    register,
    trajectories,
)


@pytest.fixture
def live() -> Iterator[LiveJob]:
    yield from live_job()


def test_a_refused_push_is_answered_and_the_stream_goes_on(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    poisoned = trajectories()
    poisoned["observation"][0, 0, 0] = math.nan
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        task = client.lease(worker_id, wait_seconds=1.0)
        bad = push_message(task, worker_id, poisoned)
        assert code_of(lambda: client.push(bad, retry_for=0)) == grpc.StatusCode.INVALID_ARGUMENT
        task = client.lease(worker_id, wait_seconds=1.0)  # the refused task, requeued
        good = push_message(task, worker_id)
        assert client.push(good, retry_for=0).accepted
        assert client.push(good, retry_for=0).duplicate
        forged = push_message(task, "someone-else")
        assert code_of(lambda: client.push(forged, retry_for=0)) == grpc.StatusCode.PERMISSION_DENIED
        assert client.pushes.supported
        assert client.pushes.opened == 1
    assert live.coordinator.progress.fragments == 1


def test_a_worker_pushing_one_call_each_gets_the_same_answers(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    poisoned = trajectories()
    poisoned["observation"][0, 0, 0] = math.nan
    with live.client() as client:  # a worker of a release before the stream: unary calls
        worker_id = register(client, "cartpole-eval-0")
        task = client.lease(worker_id, wait_seconds=1.0)
        bad = push_message(task, worker_id, poisoned)
        assert code_of(lambda: client.stub.PushFragment(bad, timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
        good = push_message(client.lease(worker_id, wait_seconds=1.0), worker_id)
        assert client.stub.PushFragment(good, timeout=10).accepted
        assert client.stub.PushFragment(good, timeout=10).duplicate
        assert client.pushes.opened == 0
    assert live.coordinator.progress.fragments == 1


def test_pushes_go_on_a_new_stream_when_rank_0_restarts(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    port = live.server.port
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        first = push_message(client.lease(worker_id, wait_seconds=1.0), worker_id)
        second = push_message(client.lease(worker_id, wait_seconds=1.0), worker_id)
        assert client.push(first, retry_for=0).accepted
        live.server.stop(grace=0.5)

        answers: list[pb.PushAck] = []
        pushing = threading.Thread(
            target=lambda: answers.extend(client.push(m, retry_for=30.0) for m in (first, second))
        )
        pushing.start()  # retried while no server listens
        live.server = CoordinatorServer(
            live.coordinator, address=f"127.0.0.1:{port}", credential=live.credential
        ).start()
        pushing.join(timeout=60.0)
        assert not pushing.is_alive()
        assert [(a.accepted, a.duplicate) for a in answers] == [(True, True), (True, False)]
        assert client.pushes.opened >= 2
    assert live.coordinator.progress.fragments == 2


def test_a_rotated_token_opens_a_new_stream_and_a_revoked_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credential_module, "RELOAD_SECONDS", 0.0)
    old, new = new_token(), new_token()
    server_tokens, client_tokens = tmp_path / "server", tmp_path / "client"

    def write(path: Path, *tokens: str) -> None:
        path.write_text("\n".join(tokens) + "\n")
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # seen as changed

    write(server_tokens, old, new)
    write(client_tokens, old)
    coordinator = Coordinator(parse_job(JOB), spaces=CARTPOLE_SPACES)
    coordinator.open_epoch(epoch=1, version=0)
    server = CoordinatorServer(
        coordinator, address="127.0.0.1:0", credential=Credential.from_file(server_tokens)
    ).start()
    try:
        with PolicyGroupClient(
            f"127.0.0.1:{server.port}", credential=Credential.from_file(client_tokens)
        ) as client:
            worker_id = register(client, "cartpole-eval-0")
            assert client.push(
                push_message(client.lease(worker_id, wait_seconds=1.0), worker_id), retry_for=0
            )
            stale = push_message(client.lease(worker_id, wait_seconds=1.0), worker_id)
            # The lease was taken while both were accepted; then the old token is dropped before
            # this pod picked up the new one: the stream opened with it is refused.
            write(server_tokens, new)
            assert code_of(lambda: client.push(stale, retry_for=0)) == grpc.StatusCode.UNAUTHENTICATED
            write(client_tokens, new)
            assert client.push(stale, retry_for=0).accepted  # on a stream opened with the new token
            assert client.pushes.opened == 2
    finally:
        coordinator.finish()
        server.stop(grace=0.5)


def test_a_coordinator_open_to_calls_without_a_credential_takes_pushes_on_the_stream() -> None:
    coordinator = Coordinator(parse_job(JOB), spaces=CARTPOLE_SPACES)
    coordinator.open_epoch(epoch=1, version=0)
    server = CoordinatorServer(coordinator, address="127.0.0.1:0", credential=Credential()).start()
    try:
        with PolicyGroupClient(f"127.0.0.1:{server.port}", credential=Credential()) as client:
            worker_id = register(client, "cartpole-eval-0")
            message = push_message(client.lease(worker_id, wait_seconds=1.0), worker_id)
            assert client.push(message, retry_for=0).accepted
            assert client.pushes.supported
    finally:
        coordinator.finish()
        server.stop(grace=0.5)


def test_a_coordinator_without_the_stream_is_pushed_to_one_call_each() -> None:
    credential = Credential.of_token(new_token())
    coordinator = Coordinator(parse_job(JOB), spaces=CARTPOLE_SPACES)
    coordinator.open_epoch(epoch=1, version=0)
    server = make_server(credential, max_workers=8, options=(), thread_name_prefix="older-rank-0")
    add_policy_group(PolicyGroupServicer(coordinator), server)  # blocking: no PushFragments
    port = listen(server, "127.0.0.1:0", credential)
    server.start()
    try:
        with PolicyGroupClient(f"127.0.0.1:{port}", credential=credential) as client:
            worker_id = register(client, "cartpole-eval-0")
            message = push_message(client.lease(worker_id, wait_seconds=1.0), worker_id)
            assert client.push(message, retry_for=0).accepted
            assert not client.pushes.supported
            assert client.push(message, retry_for=0).duplicate
    finally:
        coordinator.finish()
        server.stop(0.5)


class OutOfOrder:
    """A PushFragments call that answers each pair of pushes in reverse order."""

    def __init__(self, requests: Iterator[Any]) -> None:
        self.requests = requests
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[pb.PushAck]:
        while True:
            try:
                pair = [next(self.requests), next(self.requests)]
            except StopIteration:
                return
            for request in reversed(pair):
                yield pb.PushAck(task_id=request.task_id, accepted=True, reason=request.task_id)

    def cancel(self) -> None:
        self.cancelled.set()


def test_answers_reach_their_pushes_whatever_their_order() -> None:
    calls: list[OutOfOrder] = []

    def open_stream(requests: Iterator[Any]) -> OutOfOrder:
        calls.append(OutOfOrder(requests))
        return calls[-1]

    stream = PushStream(open_stream, token=lambda: "t")
    answers: dict[str, str] = {}

    def push(task_id: str) -> None:
        answers[task_id] = stream.push(pb.Fragment(task_id=task_id), timeout=10.0).reason

    pushers = [threading.Thread(target=push, args=(f"task-{i}",)) for i in range(2)]
    for pusher in pushers:
        pusher.start()
    for pusher in pushers:
        pusher.join(timeout=10.0)
    assert answers == {"task-0": "task-0", "task-1": "task-1"}
    stream.close()
    assert len(calls) == 1
    assert calls[0].cancelled.is_set()


class Silent:
    """A PushFragments call on a connection that died without a word: no answer until cancelled."""

    def __init__(self, requests: Iterator[Any]) -> None:
        self.cancelled = threading.Event()
        self.sent = threading.Event()  # a push went out on it
        self.reading = threading.Thread(target=self._read, args=(requests,), daemon=True)
        self.reading.start()

    def _read(self, requests: Iterator[Any]) -> None:
        for _ in requests:
            self.sent.set()

    def __iter__(self) -> Iterator[pb.PushAck]:
        self.cancelled.wait()
        raise RpcStatusError(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")

    def cancel(self) -> None:
        self.cancelled.set()


def test_a_push_without_an_answer_in_time_moves_the_pushes_to_a_new_stream() -> None:
    calls: list[Any] = []
    first = Silent(iter(()))  # replaced below by the first stream opened

    def open_stream(requests: Iterator[Any]) -> Any:
        nonlocal first
        calls.append(Silent(requests) if not calls else OutOfOrder(requests))
        if len(calls) == 1:
            first = calls[0]
            opened.set()
        return calls[-1]

    opened = threading.Event()

    stream = PushStream(open_stream, token=lambda: "t")
    codes: list[grpc.StatusCode] = []

    def push(task_id: str, timeout: float) -> None:
        try:
            stream.push(pb.Fragment(task_id=task_id), timeout=timeout)
        except grpc.RpcError as exc:
            codes.append(exc.code())

    waiting = threading.Thread(target=push, args=("in-flight", 60.0))
    waiting.start()
    assert opened.wait(10.0)
    assert first.sent.wait(10.0)
    push("timed-out", 0.2)
    waiting.join(timeout=10.0)
    # The one that timed out says so; the other on the same stream is to be pushed again (retryable).
    assert sorted(codes, key=str) == [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE]
    assert calls[0].cancelled.is_set()
    answers: list[str] = []
    pushers = [
        threading.Thread(
            target=lambda t=t: answers.append(stream.push(pb.Fragment(task_id=t), timeout=10.0).task_id)
        )
        for t in ("again-1", "again-2")
    ]
    for pusher in pushers:
        pusher.start()
    for pusher in pushers:
        pusher.join(timeout=10.0)
    assert sorted(answers) == ["again-1", "again-2"]
    assert stream.opened == 2
    stream.close()

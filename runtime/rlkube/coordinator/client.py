"""A PolicyGroup client for eval workers, follower train ranks and the local launcher.

I/O. Every call has a deadline. Transient failures (the coordinator restarting, a pod not yet
resolvable) are retried with capped exponential back-off by :meth:`PolicyGroupClient.call`
until the caller's overall deadline; anything else is raised as :class:`CoordinatorError` with
the RPC, the address and gRPC's own message.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from rlkube._proto import policy_group_pb2 as pb
from rlkube._proto import policy_group_pb2_grpc as pb_grpc
from rlkube.coordinator.push_stream import PushRequest, PushStream, StreamUnsupported
from rlkube.coordinator.wire import PUSH_METHOD, PUSH_STREAM_METHOD, EncodedFragment
from rlkube.security.credential import Credential, process_credential
from rlkube.security.grpc_auth import open_channel
from rlkube.weights.wire import CHANNEL_OPTIONS

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: gRPC codes worth retrying: the server is not there yet, restarting, or overloaded.
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
#: Deadline of one ordinary call; long polls add their wait to it.
CALL_TIMEOUT = 10.0


def serialize_push(request: PushRequest) -> bytes:
    return request.data if isinstance(request, EncodedFragment) else request.SerializeToString()


class CoordinatorError(RuntimeError):
    def __init__(self, rpc: str, address: str, code: grpc.StatusCode | None, detail: str) -> None:
        self.rpc, self.address, self.code = rpc, address, code
        name = code.name if code is not None else "ERROR"
        super().__init__(f"{rpc} to {address} failed: {name}: {detail}")


class PolicyGroupClient:
    def __init__(self, address: str, *, credential: Credential | None = None) -> None:
        self.address = address
        #: Presented on every call (default: this process's, from the env contract).
        self.credential = credential if credential is not None else process_credential()
        self._channel = open_channel(address, self.credential, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.PolicyGroupStub(self._channel)
        self.stub.PushFragment = self._channel.unary_unary(  # sends an EncodedFragment as it is
            PUSH_METHOD,
            request_serializer=serialize_push,
            response_deserializer=pb.PushAck.FromString,
            _registered_method=True,
        )
        self.pushes = PushStream(
            self._channel.stream_stream(
                PUSH_STREAM_METHOD,
                request_serializer=serialize_push,
                response_deserializer=pb.PushAck.FromString,
                _registered_method=True,
            ),
            token=self.credential.token,
        )

    def close(self) -> None:
        self.pushes.close()
        self._channel.close()

    def __enter__(self) -> PolicyGroupClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        rpc: str,
        fn: Callable[[float], T],
        *,
        timeout: float = CALL_TIMEOUT,
        retry_for: float = 0.0,
        should_stop: Callable[[], bool] | None = None,
    ) -> T:
        """``fn(timeout)`` with retries of transient failures for up to ``retry_for`` seconds."""
        deadline = time.monotonic() + retry_for
        delay = 0.2
        while True:
            try:
                return fn(timeout)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                detail = exc.details() if hasattr(exc, "details") else str(exc)
                if (
                    code not in RETRYABLE
                    or time.monotonic() + delay > deadline
                    or (should_stop and should_stop())
                ):
                    raise CoordinatorError(rpc, self.address, code, detail or "") from None
                logger.debug("%s to %s: %s; retrying in %.1fs", rpc, self.address, code, delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------------ convenience wrappers
    def register(
        self, request: pb.RegisterRequest, *, retry_for: float, should_stop=None
    ) -> pb.RegisterResponse:
        return self.call(
            "Register",
            lambda t: self.stub.Register(request, timeout=t),
            retry_for=retry_for,
            should_stop=should_stop,
        )

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        return self.call("Heartbeat", lambda t: self.stub.Heartbeat(request, timeout=t))

    def deregister(self, worker_id: str, reason: str) -> None:
        self.call(
            "Deregister",
            lambda t: self.stub.Deregister(
                pb.DeregisterRequest(worker_id=worker_id, reason=reason), timeout=t
            ),
        )

    def lease(self, worker_id: str, *, wait_seconds: float) -> pb.Task:
        request = pb.LeaseTaskRequest(worker_id=worker_id, wait_seconds=wait_seconds)
        return self.call(
            "LeaseTask",
            lambda t: self.stub.LeaseTask(request, timeout=t),
            timeout=wait_seconds + CALL_TIMEOUT,
        )

    def push(
        self,
        fragment: PushRequest,
        *,
        retry_for: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> pb.PushAck:
        # Retrying a push is safe: the coordinator acknowledges each task once (duplicates are flagged).
        return self.call(
            "PushFragment",
            lambda t: self._push_once(fragment, timeout=t),
            timeout=CALL_TIMEOUT + _size(fragment) / 50e6,
            retry_for=retry_for,
            should_stop=should_stop,
        )

    def _push_once(self, fragment: PushRequest, *, timeout: float) -> pb.PushAck:
        """One try: on the worker's push stream, or unary where the coordinator predates it."""
        if self.pushes.supported:
            try:
                return self.pushes.push(fragment, timeout=timeout)
            except StreamUnsupported:
                logger.info("the coordinator at %s has no PushFragments: pushing unary", self.address)
        return self.stub.PushFragment(fragment, timeout=timeout)

    def report_loaded(self, request: pb.ReportLoadedRequest) -> pb.ReportLoadedResponse:
        return self.call("ReportLoaded", lambda t: self.stub.ReportLoaded(request, timeout=t))

    def pull_shard(self, *, serial: int, rank: int, world_size: int, wait_seconds: float) -> pb.Fragment:
        request = pb.PullShardRequest(
            epoch=serial, rank=rank, world_size=world_size, wait_seconds=wait_seconds
        )

        def pull(timeout: float) -> pb.Fragment:
            return next(iter(self.stub.PullShard(request, timeout=timeout)))

        return self.call("PullShard", pull, timeout=wait_seconds + 60.0)

    def status(self, *, timeout: float = 2.0) -> pb.JobStatus:
        return self.call(
            "GetStatus", lambda t: self.stub.GetStatus(pb.GetStatusRequest(), timeout=t), timeout=timeout
        )


def _size(request: PushRequest) -> int:
    return len(request.data) if isinstance(request, EncodedFragment) else request.ByteSize()

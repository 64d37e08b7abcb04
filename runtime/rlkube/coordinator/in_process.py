"""The PolicyGroup transport for one process: a client whose stub calls the servicer directly.

No network I/O, no threads. ``rlkube run --in-process`` runs the cluster's eval worker against
:class:`InProcessClient`: every call goes through the very :class:`PolicyGroupServicer` methods
the gRPC server runs (the same translation, validation and answers), with a
:class:`InProcessContext` standing in for gRPC's servicer context. An ``abort`` becomes an
:class:`RpcStatusError` carrying the status code, which :meth:`PolicyGroupClient.call` turns
into the same :class:`CoordinatorError` a remote call raises, so the worker handles both alike.
Messages are passed as objects: nothing is serialised.

What the in-process transport leaves out: the server's reaper (a worker stopped at a breakpoint
keeps its leases instead of expiring) and deadlines (long polls are bounded by ``wait_seconds``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

import grpc

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import PolicyGroupClient
from rlkube.coordinator.push_stream import PushRequest, RpcStatusError
from rlkube.coordinator.service import PolicyGroupServicer
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.wire import EncodedFragment

R = TypeVar("R")

#: What ``peer()`` answers for an in-process caller.
IN_PROCESS_PEER = "in-process"


class InProcessContext:
    """The parts of ``grpc.ServicerContext`` the servicer uses, for a call made in this process."""

    def __init__(self, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._metadata = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise RpcStatusError(code, details)

    def time_remaining(self) -> float | None:
        return None  # no deadline: the servicer's own bounds (MAX_POLL_SECONDS) apply

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return IN_PROCESS_PEER

    def is_active(self) -> bool:
        return True


class InProcessStub:
    """``PolicyGroupStub``'s methods, answered by ``servicer`` in the caller's thread."""

    def __init__(self, servicer: PolicyGroupServicer, *, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.servicer = servicer
        self.metadata = tuple(metadata)

    def _unary(self, method: Callable[[Any, Any], R]) -> Callable[..., R]:
        def call(request: Any, timeout: float | None = None, **_: Any) -> R:
            if isinstance(request, EncodedFragment):  # as the server would parse it
                request = request.message()
            return method(request, InProcessContext(self.metadata))

        return call

    def _stream(self, method: Callable[[Any, Any], Iterable[R]]) -> Callable[..., Iterator[R]]:
        def call(request: Any, timeout: float | None = None, **_: Any) -> Iterator[R]:
            return iter(method(request, InProcessContext(self.metadata)))

        return call

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.servicer, name)  # AttributeError for an RPC the service lacks
        return self._stream(method) if name == "PullShard" else self._unary(method)


class InProcessClient(PolicyGroupClient):
    """A :class:`PolicyGroupClient` whose calls reach ``coordinator`` through the servicer, in process."""

    def __init__(self, coordinator: Coordinator, *, metadata: Sequence[tuple[str, str]] = ()) -> None:
        # No channel: the base class's convenience wrappers only ever use ``self.stub``.
        self.address = IN_PROCESS_PEER
        self.coordinator = coordinator
        self.stub = InProcessStub(PolicyGroupServicer(coordinator), metadata=metadata)  # type: ignore[assignment]

    def _push_once(self, fragment: PushRequest, *, timeout: float) -> pb.PushAck:
        return self.stub.PushFragment(fragment, timeout=timeout)  # one call each: nothing to set up

    def close(self) -> None:
        pass

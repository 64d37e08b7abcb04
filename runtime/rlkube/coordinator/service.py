"""The PolicyGroup gRPC service on train rank 0 (and WeightStore beside it on the same port).

I/O (gRPC server threads). Each RPC is a thin translation to :class:`~rlkube.coordinator.state.Coordinator`;
bad input (a malformed fragment, an unknown worker, a push for someone else's lease) is answered
with a gRPC status naming the problem (INVALID_ARGUMENT, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
NOT_FOUND; never UNKNOWN, see :func:`answer`) and never disturbs the server. Every call must carry
the job's credential (``rlkube.security``): the server's one interceptor refuses it
otherwise. A reaper thread expires silent workers once a second, so a vanished worker's leased
fragments go to the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, TypeVar

import grpc
import grpc.aio
from tensordict import TensorDict

from rlkube._proto import policy_group_pb2 as pb
from rlkube._proto import policy_group_pb2_grpc as pb_grpc
from rlkube.coordinator.answer_ahead import answered_ahead
from rlkube.coordinator.edge import MAX_REQUEST_BYTES, Refusal, Refused, check_name
from rlkube.coordinator.intake import AsyncIntake, GroupSync
from rlkube.coordinator.push_stream import status_code
from rlkube.coordinator.state import STOP, Coordinator, NotRegistered, PushOutcome, ShardGone
from rlkube.coordinator.tasks import TaskKind, TaskSpec
from rlkube.coordinator.threaded_handlers import OnLoop
from rlkube.coordinator.wire import SERVICE, ReceivedPush, batch_to_proto, fragment_from_proto, read_push
from rlkube.data.wire import WireError
from rlkube.security.credential import Credential, process_credential
from rlkube.security.grpc_auth import WRONG_TOKEN, listen, make_aio_server, presented_token
from rlkube.weights.consistency import WorkerLoad
from rlkube.weights.wire import MAX_MESSAGE_BYTES, abort

logger = logging.getLogger(__name__)
T = TypeVar("T")


#: The longest a long poll (LeaseTask, PullShard) may be held, whatever the client asks.
MAX_POLL_SECONDS = 30.0


def task_to_proto(task: TaskSpec | str | None) -> pb.Task:
    if task is None:
        return pb.Task(kind=pb.Task.NONE, retry_after=0.2)
    if task == STOP:
        return pb.Task(kind=pb.Task.STOP)
    assert isinstance(task, TaskSpec)
    kind = pb.Task.EVALUATE if task.kind is TaskKind.EVALUATE else pb.Task.COLLECT
    return pb.Task(
        kind=kind,
        task_id=task.task_id,
        epoch=task.epoch,
        min_version=task.min_version,
        steps=task.steps,
        episodes=task.episodes,
    )


#: Exceptions that mean "the request is malformed" when they escape the explicit checks (last resort).
BAD_INPUT: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, IndexError, OverflowError)


def answer(context: grpc.ServicerContext, call: Callable[[], T]) -> T:
    """``call()``, its refusals answered with their gRPC code and reason (never UNKNOWN)."""
    try:
        return call()
    except Exception as exc:
        found = refusal_of(exc)
        if found is None:
            raise
        abort(context, *found)


def refusal_of(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
    """The gRPC code and reason that answer ``exc``; None: not a refusal (a fault of ours)."""
    if isinstance(exc, Refused):
        code, detail = getattr(grpc.StatusCode, exc.kind.value), exc.reason
    elif isinstance(exc, NotRegistered):
        code, detail = grpc.StatusCode.NOT_FOUND, f"worker {_short(str(exc))} is not registered"
    elif isinstance(exc, ShardGone):
        code, detail = grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    elif isinstance(exc, WireError):
        code, detail = grpc.StatusCode.INVALID_ARGUMENT, f"malformed batch: {exc}"
    elif isinstance(exc, BAD_INPUT):
        logger.info("refused a malformed request: %s", exc)
        code, detail = grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {type(exc).__name__}: {exc}"
    else:
        return None
    return code, detail[:1024]


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def push_arguments(pushed: pb.Fragment | ReceivedPush) -> dict[str, Any]:
    """A PushFragment request as :meth:`Coordinator.push`'s arguments (the fragment decoded)."""
    request = pushed.message if isinstance(pushed, ReceivedPush) else pushed
    check_name("task_id", request.task_id, required=True)
    check_name("worker_id", request.worker_id, required=True)
    return {
        "task_id": request.task_id,
        "worker_id": request.worker_id,
        "fragment": fragment_from_proto(pushed) if request.batch.tensors else None,
        "episode_returns": tuple(request.episodes.returns),
        "episode_lengths": tuple(request.episodes.lengths),
        "rollout_seconds": request.rollout_seconds,
        "weight_wait_seconds": request.weight_wait_seconds,
        "lease_next": request.lease_next,
    }


#: Pushes one PushFragments stream may have read and not yet answered (``answer_ahead``); the next
#: waits unread in gRPC's flow control. A worker has at most ``task_stream.PUSH_CREDITS`` in flight;
#: this bounds a client that does not wait for its answers.
STREAM_PUSHES_AHEAD = 8


class PushStreamRevoked(Exception):
    """The token a push stream was opened with is no longer accepted (a rotated Secret)."""


class PolicyGroupServicer(pb_grpc.PolicyGroupServicer):
    def __init__(
        self,
        coordinator: Coordinator,
        intake: AsyncIntake | None = None,
        *,
        credential: Credential | None = None,
    ) -> None:
        self.coordinator = coordinator
        #: Pushes on an event loop (the server's); None: blocking pushes (in-process calls).
        self.intake = intake
        #: Checked again for each push on a stream (the interceptor checks a call once, when it opens).
        self.credential = credential

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        return answer(context, lambda: self._register(request))

    def _register(self, request: pb.RegisterRequest) -> pb.RegisterResponse:
        if request.role and request.role != "eval":
            raise Refused(Refusal.INVALID, f"role {_short(request.role)!r}: only eval workers register")
        worker = self.coordinator.register(
            pod_name=request.pod_name,
            node_name=request.node_name,
            replica_index=request.replica_index,
            num_envs=request.num_envs,
        )
        logger.info("eval worker %s joined (node %s)", worker.name, worker.node_name)
        return pb.RegisterResponse(
            worker_id=worker.worker_id,
            lease_seconds=self.coordinator.lease_seconds,
            incarnation=self.coordinator.incarnation,
            run_id=self.coordinator.run_id,
            latest=pb.WeightVersion(
                version=self.coordinator.published_version, incarnation=self.coordinator.incarnation
            ),
        )

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        def beat() -> pb.HeartbeatResponse:
            check_name("worker_id", request.worker_id, required=True)
            if not self.coordinator.heartbeat(request.worker_id):  # as LeaseTask: register again
                raise NotRegistered(request.worker_id)
            return pb.HeartbeatResponse(known=True, finished=self.coordinator.snapshot.finished)

        return answer(context, beat)

    def Deregister(
        self, request: pb.DeregisterRequest, context: grpc.ServicerContext
    ) -> pb.DeregisterResponse:
        def leave() -> pb.DeregisterResponse:
            check_name("worker_id", request.worker_id)
            check_name("reason", request.reason)
            self.coordinator.deregister(request.worker_id, reason=request.reason)
            # The public name only (``pod#n``): the rest of a worker id is what proves it holds its leases.
            public = request.worker_id.partition(".")[0]
            logger.info("eval worker %s left (%s)", _short(public), request.reason or "deregistered")
            return pb.DeregisterResponse()

        return answer(context, leave)

    def ReportLoaded(
        self, request: pb.ReportLoadedRequest, context: grpc.ServicerContext
    ) -> pb.ReportLoadedResponse:
        return answer(context, lambda: self._report_loaded(request))

    def _report_loaded(self, request: pb.ReportLoadedRequest) -> pb.ReportLoadedResponse:
        check_name("worker_id", request.worker_id, required=True)
        consistent, detail = self.coordinator.report_loaded(
            WorkerLoad(
                worker_id=request.worker_id,
                node_name=request.node_name,
                incarnation=request.incarnation,
                version=request.version,
                fingerprint=dict(request.fingerprint),
                load_seconds=request.load_seconds,
                blocked_seconds=request.blocked_seconds,
            )
        )
        if not consistent:
            logger.warning(
                "eval worker %s loaded version %d inconsistently: %s",
                _short(request.worker_id),
                request.version,
                detail,
            )
        return pb.ReportLoadedResponse(consistent=consistent, detail=detail)

    def LeaseTask(self, request: pb.LeaseTaskRequest, context: grpc.ServicerContext) -> pb.Task:
        wait = min(max(request.wait_seconds, 0.0), MAX_POLL_SECONDS, _time_left(context))

        def lease() -> pb.Task:
            check_name("worker_id", request.worker_id, required=True)
            return task_to_proto(self.coordinator.lease(request.worker_id, wait_seconds=wait))

        return answer(context, lease)

    def PushFragment(self, request: pb.Fragment | ReceivedPush, context: grpc.ServicerContext) -> pb.PushAck:
        def push() -> pb.PushAck:
            arguments = push_arguments(request)
            return self._ack(self.coordinator.push(**arguments), arguments)

        return answer(context, push)

    async def PushFragmentOnLoop(
        self, request: pb.Fragment | ReceivedPush, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PushAck:
        """:meth:`PushFragment` on the server's event loop (``coordinator.intake``)."""
        assert self.intake is not None, "served by an asyncio server only"
        ack = await self._answer_push(self.intake, request)
        if ack.code:  # refused: the call ends with the status
            await context.abort(status_code(ack.code), ack.detail)
            raise AssertionError("unreachable: ServicerContext.abort raises")
        return ack

    async def PushFragmentsOnLoop(
        self,
        requests: AsyncIterator[pb.Fragment | ReceivedPush],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.PushAck]:
        """A worker's pushes on one stream, each answered as PushFragment answers it (a refusal in
        the answer's ``code``/``detail``), in the order they are made durable."""
        intake = self.intake
        assert intake is not None, "served by an asyncio server only"
        presented = presented_token(context.invocation_metadata()) or ""
        checked_by = self.credential if self.credential is not None and self.credential.enforced else None

        async def checked() -> AsyncIterator[pb.Fragment | ReceivedPush]:
            async for request in requests:
                if checked_by is not None and not checked_by.accepts(presented):
                    raise PushStreamRevoked
                yield request

        answers = answered_ahead(
            checked(), lambda request: self._answer_push(intake, request), ahead=STREAM_PUSHES_AHEAD
        )
        try:
            async for ack in answers:  # a fault of ours (a failed sync) ends the stream, as it ends a call
                yield ack
        except PushStreamRevoked:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, WRONG_TOKEN)
        finally:
            await answers.aclose()  # answers dropped; their pushes still complete (AsyncIntake shields them)

    async def _answer_push(self, intake: AsyncIntake, request: pb.Fragment | ReceivedPush) -> pb.PushAck:
        """The answer to one push, naming its task; a refusal as its status in ``code``/``detail``."""
        message = request.message if isinstance(request, ReceivedPush) else request
        try:
            arguments = push_arguments(request)
            ack = self._ack(await intake.push(**arguments), arguments)
        except Exception as exc:
            found = refusal_of(exc)
            if found is None:
                raise
            code, detail = found
            return pb.PushAck(task_id=message.task_id, code=code.value[0], detail=detail)
        ack.task_id = message.task_id
        return ack

    def _ack(self, outcome: PushOutcome, arguments: dict[str, Any]) -> pb.PushAck:
        return pb.PushAck(
            accepted=outcome.accepted,
            duplicate=outcome.duplicate,
            reason=outcome.reason,
            fragments_acked=self.coordinator.progress.fragments,
            next=task_to_proto(outcome.next) if arguments["lease_next"] else None,
        )

    def PullShard(self, request: pb.PullShardRequest, context: grpc.ServicerContext) -> Iterator[pb.Fragment]:
        wait = min(max(request.wait_seconds, 0.0), MAX_POLL_SECONDS, _time_left(context))

        def pull() -> TensorDict | None:
            return self.coordinator.pull_shard(
                serial=request.epoch, rank=request.rank, world_size=request.world_size, wait_seconds=wait
            )

        try:
            shard = pull()
        except (ValueError, ShardGone) as exc:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if shard is None:
            abort(context, grpc.StatusCode.UNAVAILABLE, f"step {request.epoch} is not ready yet")
        yield pb.Fragment(epoch=request.epoch, batch=batch_to_proto(shard))

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.JobStatus:
        return job_status(self.coordinator)


class _Registration:
    """What the generated ``add_PolicyGroupServicer_to_server`` registers, caught to be amended."""

    def __init__(self) -> None:
        self.methods: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        pass  # the same handlers as the registered ones, rebuilt below from the amended set

    def add_registered_method_handlers(self, service: str, methods: dict[str, grpc.RpcMethodHandler]) -> None:
        assert service == SERVICE, service
        self.methods.update(methods)


def add_policy_group(servicer: PolicyGroupServicer, server: grpc.Server | grpc.aio.Server) -> None:
    """The generated registration, with PushFragment read by ``wire.read_push`` (a large push's
    payload stays in the received bytes) and, with an intake, handled on the server's loop."""
    caught = _Registration()
    pb_grpc.add_PolicyGroupServicer_to_server(servicer, caught)
    methods = dict(caught.methods)
    methods["PushFragment"] = grpc.unary_unary_rpc_method_handler(
        servicer.PushFragment if servicer.intake is None else servicer.PushFragmentOnLoop,
        request_deserializer=read_push,
        response_serializer=pb.PushAck.SerializeToString,
    )
    if servicer.intake is not None:  # else the generated UNIMPLEMENTED: clients then push unary
        methods["PushFragments"] = grpc.stream_stream_rpc_method_handler(
            servicer.PushFragmentsOnLoop,
            request_deserializer=read_push,
            response_serializer=pb.PushAck.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    server.add_registered_method_handlers(SERVICE, methods)


def _time_left(context: grpc.ServicerContext) -> float:
    remaining = context.time_remaining()
    return MAX_POLL_SECONDS if remaining is None else max(0.0, remaining - 0.5)


def job_status(coordinator: Coordinator) -> pb.JobStatus:
    """GetStatus's answer: what the engine reported (every :class:`EngineStatus` field, copied by
    name), and what the coordinator sees itself (workers, nodes, throughput)."""
    snap = coordinator.snapshot  # immutable: replaced whole by each update
    engine = {name: _wire(value) for name, value in snap.given().items()}
    now = coordinator.clock()
    published = coordinator.published_version
    loads = {w.worker_id: w for w in coordinator.loads.workers()}
    members = coordinator.members.workers()
    nodes = [
        pb.NodeWeights(node_name=node, version=version, lag=max(0, published - version), workers=count)
        for node, (version, count) in sorted(coordinator.loads.node_versions().items())
    ]
    workers = [
        pb.WorkerStatus(
            worker_id=w.name,  # the public name: the id itself is the worker's secret
            pod_name=w.pod_name,
            node_name=w.node_name,
            loaded_version=loads[w.worker_id].version if w.worker_id in loads else 0,
            last_seen=now - w.last_seen,
            fragments_refused=coordinator.refusals.of_pod(w.pod_name or "worker"),
        )
        for w in members
    ]
    ledger = coordinator.refusals
    refusals = [
        pb.FragmentRefusal(
            worker=r.worker, task=r.task, reason=r.reason[:1024], quarantined=r.quarantined, evicted=r.evicted
        )
        for r in ledger.recent
    ]
    engine["env_steps"] = max(snap.env_steps or 0, coordinator.progress.env_steps)
    return pb.JobStatus(
        **engine,
        phase_name=str(engine["phase"]),  # for operators that predate JobStatus.phase
        weight_version=published,
        nodes=nodes,
        workers=workers,
        eval_workers=len(members),
        steps_per_second=coordinator.progress.steps_per_second(now=now),
        incarnation=coordinator.incarnation,
        dropped_stale=coordinator.progress.dropped_stale,
        fragments_refused=ledger.refused,
        fragments_quarantined=ledger.quarantined,
        workers_evicted=len(ledger.evicted),
        refusals=refusals,
    )


def _wire(value: object) -> Any:
    """A status value as the proto constructor takes it (an enum by its name)."""
    return value.value if isinstance(value, Enum) else value


class CoordinatorServer:
    """The gRPC server of rank 0: PolicyGroup, plus any extra handlers (the WeightStore).

    A ``grpc.aio`` server on its own thread's event loop: pushes are handled on the loop
    (``coordinator.intake``), every other call on a pool of ``max_workers`` threads (long polls
    block one each), as are the extra handlers.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        address: str,
        extra_handlers: Sequence[grpc.GenericRpcHandler] = (),
        max_workers: int = 64,
        credential: Credential | None = None,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.coordinator = coordinator
        #: Every call must present it (default: this process's, from the env contract).
        self.credential = credential if credential is not None else process_credential()
        #: The largest request read (one push: raise it for jobs with large observations).
        self.max_request_bytes = max_request_bytes
        self.address = address
        self.extra_handlers = tuple(extra_handlers)
        self.max_workers = max_workers
        self.port = 0
        self.intake: AsyncIntake | None = None
        self._server: grpc.aio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="journal-sync")
        self._handlers = ThreadPoolExecutor(max_workers, thread_name_prefix="policy-group")
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def start(self) -> CoordinatorServer:
        loop = self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=loop.run_forever, name="policy-group-loop", daemon=True)
        self._loop_thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._open(), loop).result()
        except BaseException:
            self._close_loop()
            raise
        if not self.credential.enforced:
            logger.warning("the coordinator on %s accepts calls without a credential", self.address)
        self._reaper = threading.Thread(target=self._reap, name="coordinator-reaper", daemon=True)
        self._reaper.start()
        return self

    async def _open(self) -> None:
        server = make_aio_server(
            self.credential,
            executor=self._handlers,
            options=(
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", self.max_request_bytes),
            ),
        )
        self.intake = AsyncIntake(self.coordinator, GroupSync(asyncio.get_running_loop(), self._syncer))
        servicer = PolicyGroupServicer(self.coordinator, self.intake, credential=self.credential)
        add_policy_group(servicer, server)
        if self.extra_handlers:
            server.add_generic_rpc_handlers(
                [OnLoop(handler, self._handlers) for handler in self.extra_handlers]
            )
        try:
            self.port = listen(server, self.address, self.credential)
        except OSError:
            raise OSError(f"the coordinator cannot listen on {self.address}") from None
        await server.start()
        self._server = server

    def _reap(self) -> None:
        while not self._stop.wait(1.0):
            for departure in self.coordinator.expire():
                logger.warning(
                    "eval worker %s expired (%s); its work is reassigned",
                    departure.pod_name or "(unnamed)",
                    departure.reason,
                )

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        if self._server is not None and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop).result()
            self._server = None
        self._close_loop()

    def _close_loop(self) -> None:
        loop, thread = self._loop, self._loop_thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._loop_thread = None
        self._syncer.shutdown(wait=True)
        self._handlers.shutdown(wait=False)  # a handler past its call's end finishes on its own

    def __enter__(self) -> CoordinatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

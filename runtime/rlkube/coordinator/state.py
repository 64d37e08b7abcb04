"""The PolicyGroup coordinator's state, shared by the gRPC servicer and the engine on train rank 0.

No network I/O: the servicer (``coordinator.service``) turns RPCs into calls here, and the
engine calls the engine-facing half directly (rank 0 hosts both). One condition variable guards
membership, the work board and the shard hand-out; long polls (``lease``, ``pull_shard``) wait
on it with the deadline the caller gives. Trajectories are kept in ``rlkube.data``'s
RolloutBuffer; the work board decides which pushes are accepted (the first of each task).

Nothing from the wire is trusted (see ``coordinator.edge``): a push is accepted only from the
member that holds the task's lease, and only if its trajectories match the job's schema (learned
from the first fragment accepted), the env's spaces (``data.spaces``: given by train rank 0,
never by a worker) and hold finite observations, rewards, log-probabilities and values; a load
report only from a member, once per version; registrations are rate- and count-limited. Refusals
raise :class:`~rlkube.coordinator.edge.Refused` with the reason before any state changes.

A fragment refused for its trajectories is counted against its pod (``coordinator.refusals``),
and so is an acknowledged fragment that fails the same checks when it is taken back from the
journal (acknowledged by an older coordinator, or before the job's spaces were known): that one
is quarantined, moved out of the journal into ``<run>/quarantine/`` with a note of who sent it
and why, and its task is collected again. Training never sees either, so train ranks need not
agree on skipping a step: rank 0 decides before it commands one. A pod refused
``EVICT_AFTER_REFUSALS`` times is evicted (its leases go to the others) and may not register again.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any

from tensordict import TensorDict

from rlkube.contract import CoordinatorPhase, EngineFailure
from rlkube.coordinator.edge import (
    MAX_EPISODES_PER_PUSH,
    MAX_FINGERPRINT_ENTRIES,
    MAX_MEMBERS,
    MAX_NUM_ENVS,
    Refusal,
    Refused,
    RegistrationGate,
    check_name,
)
from rlkube.coordinator.journal import AckJournal, PendingEntry
from rlkube.coordinator.membership import Departure, Membership, Worker
from rlkube.coordinator.progress import Progress
from rlkube.coordinator.refusals import RefusalLedger, RefusalRecord, pod_of
from rlkube.coordinator.tasks import AckResult, TaskBoard, TaskKind, TaskSpec
from rlkube.data.fragment import Fragment
from rlkube.data.rollout_buffer import AddResult, EpochBatch, RolloutBuffer
from rlkube.data.schema import (
    FINITE_KEYS,
    POLICY_FINITE_KEYS,
    TrajectorySchema,
    missing_standard_keys,
    non_finite,
    non_finite_numbers,
)
from rlkube.data.spaces import TrajectorySpaces
from rlkube.spec import RLJob
from rlkube.weight_key import WeightKey
from rlkube.weights.consistency import LoadTracker, WorkerLoad

logger = logging.getLogger(__name__)

#: Returned by ``lease`` when the job is over: the worker drains and exits (or idles in a pod).
STOP = "stop"


class NotRegistered(LookupError):
    """The worker id is unknown (expired, replaced, or registered with a previous coordinator)."""


class ShardGone(LookupError):
    """A train rank asked for an epoch whose batch has been replaced (it fell behind)."""


@dataclass(frozen=True)
class EngineStatus:
    """What the engine on rank 0 reports for GetStatus (figures the coordinator cannot see itself).

    Both the typed update and the coordinator's record of it: ``coordinator.update(EngineStatus(
    epoch=3))`` sets the fields given and keeps the others (None: not given). Each field is the
    ``JobStatus`` field of the same name, copied there as it is by ``coordinator.service.job_status``
    (a test checks the names): a new engine figure is a proto field, a field here, and the
    ``update`` that sets it.
    """

    phase: CoordinatorPhase | None = None
    epoch: int | None = None
    max_epochs: int | None = None
    env_steps: int | None = None  # counted at epoch ends; live steps of the open epoch are added on top
    last_return: float | None = None
    episodes: int | None = None
    eval_return: float | None = None
    fingerprints_consistent: bool | None = None
    last_sync_time: float | None = None  # unix seconds of the newest publish
    message: str | None = None
    finished: bool | None = None
    train_ranks: int | None = None
    failure_reason: EngineFailure | None = None  # why, when phase is FAILED

    def merged(self, update: EngineStatus) -> EngineStatus:
        """This status with the fields ``update`` gives."""
        given = {f.name: getattr(update, f.name) for f in fields(update)}
        return replace(self, **{name: value for name, value in given.items() if value is not None})

    def given(self) -> dict[str, Any]:
        """The fields set, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class TrajectoryProblem:
    """Why the trainer could not take a fragment."""

    reason: str
    #: False for a mismatch with the schema learned from the first fragment accepted: that schema is
    #: only the first pusher's word, so a difference from it never counts towards evicting the sender.
    counts: bool = True


@dataclass(frozen=True)
class PushOutcome:
    accepted: bool
    duplicate: bool = False
    reason: str = ""
    #: The pusher's next task when it asked for one (``lease_next``): a task, STOP, or None (none now).
    next: TaskSpec | str | None = None


@dataclass(eq=False)
class StagedPush:
    """A push checked and written to the journal (``entry``; None without one), not yet acknowledged."""

    task_id: str
    worker_id: str
    fragment: Fragment
    rollout_seconds: float
    weight_wait_seconds: float
    lease_next: bool
    entry: PendingEntry | None = None


class Committing(Enum):
    """A retry of a push that is still being journalled (:meth:`Coordinator.stage_push` without wait)."""

    COMMITTING = "committing"


COMMITTING = Committing.COMMITTING


@dataclass
class Coordinator:
    """Membership, work, trajectories, weight loads and progress of one job (see the module docstring)."""

    job: RLJob
    world_size: int = 1
    lease_seconds: float = 15.0
    clock: Callable[[], float] = time.monotonic
    incarnation: str = field(default_factory=lambda: secrets.token_hex(8))
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    #: Acknowledged fragments are journalled here before the worker hears so (both engines).
    journal: AckJournal | None = None
    #: A journal write that failed (a full or read-only disk): the engine ends the run with it,
    #: since no fragment can be acknowledged any more (``rlkube.engine.trainer``).
    journal_error: OSError | None = None
    #: Live members at most (a registration past it is refused RESOURCE_EXHAUSTED).
    max_members: int = MAX_MEMBERS
    #: Registrations admitted: a burst, then a steady rate (see ``coordinator.edge``).
    registrations: RegistrationGate = field(default_factory=RegistrationGate)
    #: The leaves every fragment must have; None: learned from the first fragment accepted.
    schema: TrajectorySchema | None = None
    #: The env's spaces every fragment's observations and actions must fit (set by train rank 0
    #: from the env it built its networks with); None: not checked.
    spaces: TrajectorySpaces | None = None

    def __post_init__(self) -> None:
        spec = self.job.spec
        per_epoch = spec.fragments_per_epoch()
        self.fragments_per_epoch = per_epoch
        self.members = Membership(lease_seconds=self.lease_seconds)
        self.board = TaskBoard(fragment_length=spec.train.fragment_length)
        self.buffer = RolloutBuffer(
            fragments_per_epoch=per_epoch, capacity=max(spec.buffer.capacity, per_epoch)
        )
        self.loads = LoadTracker()
        self.progress = Progress()
        self._finite_keys = POLICY_FINITE_KEYS if spec.env.allow_non_finite else FINITE_KEYS
        #: What the engine reported (every field given: the status before the first report).
        self.snapshot = EngineStatus(
            phase=CoordinatorPhase.STARTING,
            epoch=0,
            max_epochs=spec.train.max_epochs,
            env_steps=0,
            episodes=0,
            fingerprints_consistent=True,
            last_sync_time=0.0,
            message="",
            finished=False,
            train_ranks=self.world_size,
        )
        self._cond = threading.Condition()
        self._shard_batch: EpochBatch | None = None
        self._shard_serial = -1  # which engine step the batch belongs to
        self._evaluations: dict[str, tuple[tuple[float, ...], tuple[int, ...]]] = {}
        #: When the first eval worker registered (clock time): the start-up a run's wall time includes.
        self.first_registration_at: float | None = None
        self._published_version = 0
        self._version_checks: dict[int, list[bool]] = {}  # version -> each worker's fingerprint verdict
        #: Acknowledged fragments of a previous incarnation taken back from the journal.
        self.replayed = 0
        self._replay: deque[tuple[str, Fragment]] = deque()  # taken back, waiting for buffer room
        self._reported: dict[str, set[WeightKey]] = {}  # worker -> keys it reported
        self._committing: set[str] = (
            set()
        )  # tasks acknowledged on the board, their journal entry being written
        #: Fragments refused or quarantined, per pod, and the pods evicted for them.
        self.refusals = RefusalLedger()
        self._published_versions: set[int] = set()  # by this incarnation (the newest 64)

    # ================================================================= worker-facing (RPCs)
    def register(self, *, pod_name: str, node_name: str, replica_index: int, num_envs: int) -> Worker:
        """Add an eval worker; :class:`Refused` for bad names, too many members or too many registrations."""
        check_name("pod_name", pod_name)
        check_name("node_name", node_name)
        if not 0 <= replica_index < (1 << 31):
            raise Refused(Refusal.INVALID, f"replica_index {replica_index} is out of range")
        if not 0 <= num_envs <= MAX_NUM_ENVS:
            raise Refused(Refusal.INVALID, f"num_envs {num_envs}: between 0 and {MAX_NUM_ENVS}")
        with self._cond:
            barred = self.refusals.barred(pod_name)
            if barred is not None:
                raise Refused(Refusal.DENIED, f"pod {pod_name or '(unnamed)'} was evicted: {barred}")
            replacing = any(w.pod_name == pod_name for w in self.members.workers()) if pod_name else False
            if len(self.members) >= self.max_members and not replacing:
                raise Refused(
                    Refusal.EXHAUSTED, f"the job has {len(self.members)} eval workers, the most it takes"
                )
            if not self.registrations.admit(self.clock()):
                raise Refused(Refusal.EXHAUSTED, "too many registrations; retry in a second")
            worker, replaced = self.members.register(
                pod_name=pod_name,
                node_name=node_name,
                replica_index=replica_index,
                num_envs=num_envs,
                now=self.clock(),
            )
            self._forget(replaced)
            self.loads.register(worker.worker_id, node_name)
            if self.first_registration_at is None:
                self.first_registration_at = self.clock()
            self._cond.notify_all()
            return worker

    def heartbeat(self, worker_id: str) -> bool:
        """True when the worker is known (False: it must register again)."""
        with self._cond:
            return self.members.touch(worker_id, now=self.clock()) is not None

    def deregister(self, worker_id: str, *, reason: str) -> None:
        with self._cond:
            departure = self.members.deregister(worker_id, reason=reason)
            if departure is not None:
                self._forget([departure])
            self._cond.notify_all()

    def expire(self) -> list[Departure]:
        """Drop workers whose lease ran out and hand their work to others; call about once a second."""
        with self._cond:
            gone = self.members.expire(now=self.clock())
            if gone:
                self._forget(gone)
                self._cond.notify_all()
            return gone

    def _forget(self, departures: list[Departure]) -> None:
        for departure in departures:
            self.board.release_worker(departure.worker_id)
            self.loads.forget(departure.worker_id)
            self._reported.pop(departure.worker_id, None)

    def lease(self, worker_id: str, *, wait_seconds: float) -> TaskSpec | str | None:
        """The worker's next task, :data:`STOP` when the job is over, or None after ``wait_seconds``."""
        deadline = self.clock() + max(0.0, wait_seconds)
        with self._cond:
            while True:
                if self.snapshot.finished:
                    return STOP
                if self.members.touch(worker_id, now=self.clock()) is None:
                    raise NotRegistered(worker_id)
                task = self.board.lease(worker_id)
                if task is not None:
                    return task
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 1.0))

    def push(
        self,
        *,
        task_id: str,
        worker_id: str,
        fragment: Fragment | None,
        episode_returns: tuple[float, ...] = (),
        episode_lengths: tuple[int, ...] = (),
        rollout_seconds: float = 0.0,
        weight_wait_seconds: float = 0.0,
        lease_next: bool = False,
    ) -> PushOutcome:
        """Accept the first push of a task from its lease holder; later pushes of it are duplicates.

        :class:`Refused` (nothing changes): DENIED for a caller that is not a member, not the
        task's lease holder, or not the worker whose push was acknowledged; INVALID for
        trajectories that do not fit the job's schema, the task's shape, or are not finite (the
        task goes back to the queue for another worker).

        A fragment is journalled outside the lock (other pushes, leases and the engine go on
        meanwhile; see ``coordinator.journal``) and acknowledged once it is durable; a retry of it
        that arrives meanwhile waits for that. ``lease_next``: the outcome also carries the
        worker's next task (:attr:`PushOutcome.next`), saving it a LeaseTask round trip.

        The blocking form of :meth:`stage_push`, the journal's sync, then :meth:`complete_push`
        (an event loop awaits the sync instead: ``coordinator.intake``).
        """
        staged = self.stage_push(
            task_id=task_id,
            worker_id=worker_id,
            fragment=fragment,
            episode_returns=episode_returns,
            episode_lengths=episode_lengths,
            rollout_seconds=rollout_seconds,
            weight_wait_seconds=weight_wait_seconds,
            lease_next=lease_next,
        )
        assert staged is not COMMITTING  # stage_push waits for it
        if not isinstance(staged, StagedPush):
            return staged
        if staged.entry is not None:
            try:
                staged.entry.segment.sync_through(staged.entry.end)
            except OSError as exc:
                self.abandon_push(staged, exc)
                raise
        return self.complete_push(staged)

    def stage_push(
        self,
        *,
        task_id: str,
        worker_id: str,
        fragment: Fragment | None,
        episode_returns: tuple[float, ...] = (),
        episode_lengths: tuple[int, ...] = (),
        rollout_seconds: float = 0.0,
        weight_wait_seconds: float = 0.0,
        lease_next: bool = False,
        wait: bool = True,
    ) -> PushOutcome | StagedPush | Committing:
        """:meth:`push` up to its journal entry written, not yet durable.

        A :class:`PushOutcome` when the push is answered now (a duplicate, a closed task, an
        evaluation), a :class:`StagedPush` for :meth:`complete_push` once its entry is durable.
        A retry of a push still being journalled waits for it (``wait``) or, without ``wait``, is
        answered :data:`COMMITTING` (stage it again once that push is complete).
        """
        check_name("task_id", task_id, required=True)
        check_name("worker_id", worker_id, required=True)
        if len(episode_returns) > MAX_EPISODES_PER_PUSH or len(episode_returns) != len(episode_lengths):
            raise Refused(
                Refusal.INVALID, f"{len(episode_returns)} episode returns, {len(episode_lengths)} lengths"
            )
        if non_finite_numbers(episode_returns) or any(n < 0 for n in episode_lengths):
            raise Refused(Refusal.INVALID, "episode returns must be finite and lengths not negative")
        with self._cond:
            if self.members.touch(worker_id, now=self.clock()) is None:
                raise Refused(Refusal.DENIED, "the pushing worker is not registered with this coordinator")
            while task_id in self._committing:  # its first push is being journalled: answer as that does
                if not wait:
                    return COMMITTING
                self._cond.wait(1.0)
            acked_by = self.board.acked_by(task_id)
            if acked_by is not None:
                if acked_by != worker_id:
                    raise Refused(Refusal.DENIED, f"task {task_id} was pushed by another worker")
                self.progress.duplicates += 1
                return PushOutcome(
                    accepted=True, duplicate=True, next=self._lease_next(worker_id, lease_next)
                )
            if not self.board.is_open(task_id):
                return PushOutcome(
                    accepted=False,
                    reason=f"task {task_id} is not open (an earlier epoch?)",
                    next=self._lease_next(worker_id, lease_next),
                )
            if self.board.holder(task_id) != worker_id:
                raise Refused(Refusal.DENIED, f"task {task_id} is not leased to this worker")
            task = self.board.task(task_id)
            if task.kind is TaskKind.COLLECT:
                self._check_fragment(task, worker_id, fragment)
            result, acked = self.board.ack(task_id, worker_id)
            if result is not AckResult.ACCEPTED or acked is None:  # checked above, under the same lock
                return PushOutcome(accepted=False, reason=f"task {task_id} is not open")
            if task.kind is TaskKind.EVALUATE:
                self._evaluations[task_id] = (episode_returns, episode_lengths)
                self._cond.notify_all()
                return PushOutcome(accepted=True, next=self._lease_next(worker_id, lease_next))
            assert fragment is not None
            journal = self.journal
            # A stream's fragment belongs to the step that takes it (``wait_batch``).
            epoch = None if self.board.streaming else task.epoch
            name = self._name_of(worker_id)
            if journal is not None:
                self._committing.add(task_id)
        staged = StagedPush(task_id, worker_id, fragment, rollout_seconds, weight_wait_seconds, lease_next)
        if journal is not None:  # durable before it is acknowledged; outside the lock
            try:
                staged.entry = journal.append(epoch=epoch, fragment=fragment, key=task_id, worker=name)
            except OSError as exc:
                self.abandon_push(staged, exc)
                raise
        return staged

    def abandon_push(self, staged: StagedPush, error: OSError) -> None:
        """A staged push whose journal entry could not be made durable: never acknowledged, and the
        coordinator acknowledges nothing more (the run ends with ``error``)."""
        if staged.entry is not None and self.journal is not None:
            self.journal.abandon(staged.entry)
        with self._cond:
            self._committing.discard(staged.task_id)
            self.board.withdraw(staged.task_id)
            self.journal_error = error
            self._cond.notify_all()

    def complete_push(self, staged: StagedPush) -> PushOutcome:
        """Acknowledge a staged push whose journal entry (if any) is durable."""
        if staged.entry is not None and self.journal is not None:
            self.journal.settle(staged.entry)
        fragment, worker_id = staged.fragment, staged.worker_id
        with self._cond:
            self._committing.discard(staged.task_id)
            added = self.buffer.add(staged.task_id, fragment)
            if added is AddResult.FULL:  # cannot happen while the board bounds the work; be safe
                self.board.release_worker(worker_id)
                self._cond.notify_all()
                return PushOutcome(accepted=False, reason="trajectory buffer is full; retry")
            if self.schema is None:
                self.schema = TrajectorySchema.of(fragment.data)
            self.progress.record_fragment(
                env_steps=fragment.env_steps,
                episodes=len(fragment.episode_returns),
                now=self.clock(),
                rollout_seconds=staged.rollout_seconds,
                weight_wait_seconds=staged.weight_wait_seconds,
            )
            worker = self.members.get(worker_id)
            if worker is not None:
                worker.fragments_pushed += 1
                worker.env_steps += fragment.env_steps
            self._cond.notify_all()
            return PushOutcome(accepted=True, next=self._lease_next(worker_id, staged.lease_next))

    def _lease_next(self, worker_id: str, wanted: bool) -> TaskSpec | str | None:
        """The next task of a worker that asked for it with its push (no wait; None: none now)."""
        if not wanted:
            return None
        if self.snapshot.finished:
            return STOP
        if self.members.get(worker_id) is None:
            return None
        return self.board.lease(worker_id)

    def _check_fragment(self, task: TaskSpec, worker_id: str, fragment: Fragment | None) -> None:
        """Refuse (INVALID, requeueing the task) trajectories the trainer could not train on."""
        problem, counts = None, True
        if fragment is None:
            problem = f"task {task.task_id} needs a trajectory batch"
        else:
            worker = self.members.get(worker_id)
            num_envs = worker.num_envs if worker is not None and worker.num_envs else fragment.num_envs
            if task.steps and (fragment.length, fragment.num_envs) != (task.steps, num_envs):
                problem = (
                    f"batch is [{fragment.num_envs}, {fragment.length}], the task asks for "
                    f"[{num_envs}, {task.steps}] (num_envs x steps)"
                )
            else:
                found = self.trajectory_problem(fragment.data)
                problem, counts = (found.reason, found.counts) if found is not None else (None, True)
        if problem is not None:
            self.board.requeue(task.task_id)
            name = self._name_of(worker_id)
            record = self.refusals.record(worker=name, task_id=task.task_id, reason=problem, counts=counts)
            logger.warning("refused a fragment of eval worker %s (task %s): %s", name, record.task, problem)
            if record.evicted:
                self._evict(record)
            self._cond.notify_all()
            raise Refused(Refusal.INVALID, f"fragment refused: {problem}")

    def trajectory_problem(self, data: TensorDict) -> TrajectoryProblem | None:
        """Why the trainer could not take ``data`` (keys, spaces, finiteness, schema); None: it can."""
        problem = missing_standard_keys(data)
        if problem is None and self.spaces is not None:
            problem = self.spaces.violation(data)
        problem = problem or non_finite(data, self._finite_keys)
        if problem is not None:
            return TrajectoryProblem(problem)
        mismatch = self.schema.mismatch(TrajectorySchema.of(data)) if self.schema is not None else None
        return TrajectoryProblem(mismatch, counts=False) if mismatch is not None else None

    def _evict(self, record: RefusalRecord) -> None:
        """Remove the live workers of ``record``'s pod (their leases go back to the queue)."""
        pod = pod_of(record.worker)
        reason = self.refusals.evicted.get(pod, record.reason)
        gone = [w.worker_id for w in self.members.workers() if (w.pod_name or "worker") == pod]
        departures = [d for d in (self.members.deregister(i, reason=f"evicted: {reason}") for i in gone) if d]
        self._forget(departures)
        logger.warning("eval pod %s evicted: %s", pod, reason)

    def _take_back(self, replayed: list[tuple[str, Fragment]]) -> list[tuple[str, Fragment]]:
        """The journalled fragments the trainer can take; the others are quarantined (see the module doc)."""
        kept = []
        for key, fragment in replayed:
            found = self.trajectory_problem(fragment.data)
            if found is None:
                kept.append((key, fragment))
                continue
            problem = found.reason
            assert self.journal is not None
            worker, task_id = self.journal.origin(key)
            try:
                where = str(self.journal.quarantine(key, reason=problem))
            except OSError as exc:  # not trained either way; taken back (and refused) again next time
                where = f"nowhere ({exc})"
            record = self.refusals.record(
                worker=worker or "(unknown)",
                task_id=task_id,
                reason=problem,
                quarantined=True,
                counts=found.counts,
            )
            logger.warning(
                "quarantined an acknowledged fragment of %s (task %s) in %s: %s",
                record.worker,
                record.task,
                where,
                problem,
            )
            if record.evicted:
                self._evict(record)
        return kept

    def _name_of(self, worker_id: str) -> str:
        worker = self.members.get(worker_id)
        return worker.name if worker is not None else worker_id.partition(".")[0]

    def report_loaded(self, load: WorkerLoad) -> tuple[bool, str]:
        """Record a worker's loaded version; :class:`NotRegistered` for a worker that is not a member.

        A report from a worker this coordinator does not know (one registered with a previous
        coordinator that has not noticed the restart yet, or one already expired) is refused: taken
        in, it would be waited for, forever behind, when the run ends.
        """
        check_name("node_name", load.node_name)
        check_name("incarnation", load.incarnation)
        if len(load.fingerprint) > MAX_FINGERPRINT_ENTRIES:
            raise Refused(
                Refusal.INVALID,
                f"a fingerprint of {len(load.fingerprint)} entries; at most {MAX_FINGERPRINT_ENTRIES}",
            )
        if any(len(name) > 1024 for name in load.fingerprint) or non_finite_numbers(
            load.fingerprint.values()
        ):
            raise Refused(
                Refusal.INVALID, "fingerprint entries need names of <= 1024 characters and finite norms"
            )
        with self._cond:
            if self.members.touch(load.worker_id, now=self.clock()) is None:
                raise NotRegistered(load.worker_id)
            key = WeightKey(load.incarnation, load.version)
            reported = self._reported.setdefault(load.worker_id, set())
            if key in reported:
                raise Refused(Refusal.DENIED, f"version {load.version} was already reported by this worker")
            reported.add(key)
            if len(reported) > 64:
                reported.discard(min(reported, key=lambda k: k.version))
            consistent, detail = self.loads.report(load, now=self.clock())
            if load.incarnation != self.incarnation or load.version not in self._published_versions:
                # Only a version this trainer published has a verdict: a report of any other
                # (a future one, or another incarnation's) must not mark the job consistent.
                return False, f"version {load.version} of {load.incarnation!r} was never published here"
            self._version_checks.setdefault(load.version, []).append(consistent)
            for old in sorted(self._version_checks)[:-64]:
                del self._version_checks[old]
        return consistent, detail

    def version_consistency(self, version: int) -> bool | None:
        """Whether every report of ``version`` matched the trainer's fingerprint; None without reports."""
        with self._cond:
            verdicts = self._version_checks.get(version)
            return None if not verdicts else all(verdicts)

    def pull_shard(
        self, *, serial: int, rank: int, world_size: int, wait_seconds: float
    ) -> TensorDict | None:
        """Rank ``rank``'s share of engine step ``serial``; None if it is not ready in ``wait_seconds``."""
        if world_size != self.world_size:
            raise ValueError(f"world size {world_size} differs from the coordinator's {self.world_size}")
        deadline = self.clock() + max(0.0, wait_seconds)
        with self._cond:
            while self._shard_serial < serial:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 1.0))
            if self._shard_serial > serial or self._shard_batch is None:
                raise ShardGone(f"step {serial} was replaced by step {self._shard_serial}")
            return self._shard_batch.shard(rank, world_size)

    # ================================================================= engine-facing (rank 0)
    def open_epoch(self, *, epoch: int, version: int) -> None:
        """Queue the epoch's tasks; fragments of it acknowledged before a crash (journalled) are
        taken back first, and only the missing tasks are queued."""
        with self._cond:
            replayed = self.journal.replay(epoch=epoch)[: self.fragments_per_epoch] if self.journal else []
            replayed = self._take_back(replayed)
            for key, fragment in replayed:
                self.buffer.add(key, fragment)
            if replayed:
                self.replayed += len(replayed)
                logger.info(
                    "epoch %d: %d acknowledged fragments taken back from the journal", epoch, len(replayed)
                )
            self.board.open_epoch(
                epoch=epoch, version=version, fragments=self.fragments_per_epoch - len(replayed)
            )
            self._cond.notify_all()

    def durable(self) -> None:
        """What the journal has written is on disk: call before saving a checkpoint (see
        ``AckJournal.taken``)."""
        if self.journal is not None:
            self.journal.durable()

    def checkpointed(self, *, epoch: int) -> None:
        """A checkpoint now holds ``epoch`` trained epochs: their journalled fragments can go."""
        if self.journal is not None:
            self.journal.checkpointed(epoch)

    def open_stream(self, *, min_version: int, step: int = 0) -> None:
        """Async mode from step ``step``: fragments acknowledged before a crash and not in the
        checkpoint (journalled: taken by steps ``>= step`` or by none yet) come first, and count
        against the stream's capacity until the trainer takes them."""
        with self._cond:
            replayed = self._take_back(self.journal.replay(since=step) if self.journal else [])
            self._replay.extend(replayed)
            self.replayed += len(replayed)
            if replayed:
                logger.info(
                    "step %d: %d acknowledged fragments taken back from the journal", step, len(replayed)
                )
            self._refill()
            self.board.open_stream(
                capacity=self.buffer.capacity,
                min_version=min_version,
                waiting=len(self._replay) + len(self.buffer),
            )
            self._cond.notify_all()

    def acknowledged_and_queued(self) -> tuple[dict[str, int], int]:
        """(what each incarnation acknowledged, per the journal; how many acknowledged fragments no
        step has taken yet, e.g. left over when an async run ends), read at one instant."""
        with self._cond:
            counts = self.journal.acknowledged_by_incarnation() if self.journal is not None else {}
            return counts, len(self.buffer) + len(self._replay)

    def _refill(self) -> None:
        """Move taken-back fragments into the buffer while it has room (their turn comes first)."""
        while self._replay and self.buffer.has_room():
            key, fragment = self._replay.popleft()
            self.buffer.add(key, fragment)

    def set_min_version(self, version: int) -> None:
        with self._cond:
            self.board.set_stream_min_version(version)
            self._cond.notify_all()

    def wait_batch(self, *, timeout: float, step: int | None = None) -> EpochBatch | None:
        """One epoch's worth of fragments, or None if they are not in within ``timeout``.

        ``step``: the engine step that takes them (default: the open sync epoch); their journal
        entries are filed under it, so the checkpoint after it makes them redundant.
        """
        if not self.buffer.wait_ready(timeout=timeout):
            return None
        batch = self.buffer.take_epoch()
        if self.journal is not None:  # outside the lock, as a push's entry
            try:
                self.journal.taken(epoch=self.board.epoch if step is None else step, keys=batch.task_ids)
            except OSError as exc:
                with self._cond:
                    self.journal_error = exc
        with self._cond:
            self.board.consumed(len(batch.fragments))
            self._refill()
            self._cond.notify_all()
        return batch

    def offer_shards(self, batch: EpochBatch, *, serial: int) -> TensorDict:
        """Make ``batch`` the one ranks pull for step ``serial``; returns rank 0's own share."""
        with self._cond:
            self._shard_batch = batch
            self._shard_serial = serial
            self._cond.notify_all()
        return batch.shard(0, self.world_size)

    def evaluate(
        self, *, epoch: int, version: int, episodes: int, timeout: float
    ) -> tuple[float, ...] | None:
        """Have one eval worker play ``episodes`` greedy episodes; their returns, or None on timeout."""
        with self._cond:
            task_id = self.board.add_evaluation(epoch=epoch, version=version, episodes=episodes)
            self._cond.notify_all()
            deadline = self.clock() + timeout
            while task_id not in self._evaluations:
                remaining = deadline - self.clock()
                if remaining <= 0 or self.snapshot.finished:
                    return None
                self._cond.wait(min(remaining, 1.0))
            returns, _ = self._evaluations.pop(task_id)
            return returns

    def published(self, *, version: int, fingerprint: dict[str, float] | None, incarnation: str) -> None:
        with self._cond:
            self._published_version = version
            self._published_versions.add(version)
            if len(self._published_versions) > 64:
                self._published_versions.discard(min(self._published_versions))
            self.snapshot = self.snapshot.merged(EngineStatus(last_sync_time=time.time()))
        self.loads.published(incarnation, version, fingerprint)

    def update(self, status: EngineStatus) -> None:
        """Engine progress for GetStatus: the fields ``status`` gives (see :class:`EngineStatus`)."""
        with self._cond:
            self.snapshot = self.snapshot.merged(status)
            self._cond.notify_all()

    def finish(
        self,
        *,
        phase: CoordinatorPhase = CoordinatorPhase.COMPLETE,
        message: str = "",
        failure_reason: EngineFailure | None = None,
    ) -> None:
        """The job is over: leases answer STOP, the board is closed. A failed job names its
        ``failure_reason`` (default: :attr:`EngineFailure.TRAINING_FAILED`)."""
        phase = CoordinatorPhase(phase)
        if phase is CoordinatorPhase.FAILED and failure_reason is None:
            failure_reason = EngineFailure.TRAINING_FAILED
        with self._cond:
            done = EngineStatus(finished=True, phase=phase, message=message, failure_reason=failure_reason)
            self.snapshot = self.snapshot.merged(done)
            self.board.close()
            self._cond.notify_all()

    def trajectory_counts(self) -> tuple[int, dict[int, int]]:
        """(tasks leased and not pushed yet, lag -> trained fragments): for the metrics endpoint."""
        with self._cond:
            return len(self.board.leased()), self.progress.lag_distribution()

    def refusal_summary(self) -> dict[str, Any]:
        """The summary's account of refused and quarantined fragments (quarantined: over every
        incarnation, from the quarantine notes), the newest refusals and the evicted pods."""
        with self._cond:
            ledger = self.refusals
            quarantined = self.journal.quarantined() if self.journal is not None else ledger.quarantined
            return {
                "fragments_refused": ledger.refused,
                "fragments_quarantined": quarantined,
                "workers_evicted": sorted(ledger.evicted),
                "refusals": [asdict(record) for record in ledger.recent],
            }

    def live_workers(self) -> int:
        with self._cond:
            return len(self.members)

    @property
    def published_version(self) -> int:
        return self._published_version

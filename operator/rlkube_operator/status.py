"""RLJob status: observed children and the coordinator's report -> phase, conditions, progress.

Pure: no I/O, no clock; the caller passes ``now`` and what it observed. The handlers turn the
Kubernetes objects and the gRPC ``JobStatus`` into :class:`Children` and :class:`CoordinatorReport`,
call :func:`derive_status` and patch the result only when :func:`status_changed` says so.

Rules (see docs/rljob-reference.md):

* ``lastTransitionTime`` moves only when a condition's status flips; a condition whose reason or
  message changes keeps its time. ``observedGeneration`` is the generation the status was
  derived from. Deriving twice from the same observations yields the same status (no patch).
* ``Complete`` and ``Failed`` are terminal and sticky; the final progress figures are kept.
* What counts against ``runPolicy.backoffLimit`` (restarts of the train group, per rank and pod
  uid, so pods recreated by the StatefulSet controller do not reset it), and when the deadline is
  due, are :mod:`rlkube.run_policy`'s decisions, shared with ``rlkube run``.
* A pod that says why it stopped (its termination message, :class:`PodFailure`) fails the job at
  once with that reason when no restart can fix it (``PERMANENT_FAILURES``: a bad policy type, env
  id, checkpoint, ...); other failures go through ``backoffLimit``. The newest one stays in
  ``status.lastFailure`` after the pods are gone.
* A new generation of a job that failed for its spec (``InvalidSpec`` or a permanent pod failure)
  is derived from scratch (:func:`previous_status`): fixing the spec starts the job.
* A spec change that replaces the train pods sets ``Restarting`` with reason ``SpecChanged``
  naming the fields (:func:`spec_change_status`) until every train rank runs the new spec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from rlkube import run_policy
from rlkube.contract import (
    LABEL_JOB,
    LABEL_ROLE,
    PERMANENT_FAILURES,
    CoordinatorPhase,
    EngineFailure,
    FailureReason,
    Role,
    eval_statefulset_name,
)
from rlkube.run_policy import PodRestarts, RestartLedger
from rlkube.spec import RLJob, RLJobSpec


class Phase(StrEnum):
    """The one-word summary shown by ``kubectl get rlj``."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"

    def is_terminal(self) -> bool:
        return self in (Phase.COMPLETE, Phase.FAILED)


class ConditionType(StrEnum):
    SUSPENDED = "Suspended"
    TRAIN_READY = "TrainReady"
    EVAL_AVAILABLE = "EvalAvailable"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETE = "Complete"
    FAILED = "Failed"


class Reason(StrEnum):
    """Every reason a condition can carry (CamelCase, as Kubernetes conventions ask)."""

    JOB_SUSPENDED = "JobSuspended"
    JOB_RESUMED = "JobResumed"
    NOT_SUSPENDED = "NotSuspended"
    ALL_TRAIN_RANKS_READY = "AllTrainRanksReady"
    TRAIN_RANKS_NOT_READY = "TrainRanksNotReady"
    EVAL_REPLICAS_AVAILABLE = "EvalReplicasAvailable"
    NO_EVAL_REPLICAS_READY = "NoEvalReplicasReady"
    EVAL_SCALED_TO_ZERO = "EvalScaledToZero"
    TRAINING = "Training"
    WAITING_FOR_TRAIN_RANKS = "WaitingForTrainRanks"
    WAITING_FOR_COORDINATOR = "WaitingForCoordinator"
    TRAIN_POD_RESTARTED = "TrainPodRestarted"
    NO_RESTARTS = "NoRestarts"
    RECOVERED = "Recovered"
    TRAINING_FINISHED = "TrainingFinished"
    NOT_FINISHED = "NotFinished"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    EVAL_BACKOFF_LIMIT_EXCEEDED = "EvalBackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    TRAINING_FAILED = EngineFailure.TRAINING_FAILED.value
    INVALID_SPEC = "InvalidSpec"
    NO_FAILURE = "NoFailure"
    JOB_FINISHED = "JobFinished"
    NON_FINITE_WEIGHTS = EngineFailure.NON_FINITE_WEIGHTS.value
    SPEC_CHANGED = "SpecChanged"
    # What a pod's termination message says (rlkube.contract.FailureReason), and the rest.
    ENV_CONTRACT_BROKEN = FailureReason.ENV_CONTRACT_BROKEN.value
    IMPORT_FAILED = FailureReason.IMPORT_FAILED.value
    POLICY_NOT_REGISTERED = FailureReason.POLICY_NOT_REGISTERED.value
    POLICY_CONFIG_INVALID = FailureReason.POLICY_CONFIG_INVALID.value
    BUFFER_NOT_SUPPORTED = FailureReason.BUFFER_NOT_SUPPORTED.value
    ENV_NOT_FOUND = FailureReason.ENV_NOT_FOUND.value
    CHECKPOINT_NOT_FOUND = FailureReason.CHECKPOINT_NOT_FOUND.value
    POLICY_ERROR = FailureReason.POLICY_ERROR.value
    CRASHED = FailureReason.CRASHED.value
    #: A pod failed with a reason this operator does not know (or none: the log's tail).
    POD_FAILED = "PodFailed"
    # Kueue's decision, on Suspended (kueueIntegration RLJob: rlkube_operator.kueue_workload).
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    PREEMPTED = "Preempted"


#: Failed for one of these, a job starts again when its spec changes (a new generation).
SPEC_FAILURES = frozenset({Reason.INVALID_SPEC, *(Reason(r) for r in PERMANENT_FAILURES)})


CONDITION_ORDER: tuple[ConditionType, ...] = tuple(ConditionType)

#: Conditions whose flip to True is worth a Warning event rather than a Normal one.
WARNING_CONDITIONS = frozenset({ConditionType.FAILED, ConditionType.RESTARTING})


# The status document (the CRD's status schema is generated from these models) ---------------


class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="ignore")


class Condition(_Status):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: Reason
    message: str = ""
    last_transition_time: str
    observed_generation: int = 0


class TrainStatus(_Status):
    replicas: int = Field(0, description="Train pods that exist.")
    ready_replicas: int = Field(0, description="Train pods that are ready.")
    ready: str = Field("0/0", description="ready/desired, for printer columns.")
    restarts: int = Field(
        0, description="Restarts of the train group (its most-restarted rank), checked against backoffLimit."
    )
    pod_restarts: dict[str, int] = Field(
        default_factory=dict, description="Bookkeeping: restart count last seen per live train pod uid."
    )
    rank_restarts: dict[str, int] = Field(
        default_factory=dict, description="Bookkeeping: restarts per train rank, across its pods."
    )


class EvalStatus(_Status):
    replicas: int = Field(0, description="Eval pods that exist (the scale subresource's status replicas).")
    ready_replicas: int = Field(0, description="Eval pods that are ready.")
    ready: str = Field("0/0", description="ready/desired, for printer columns.")
    selector: str = Field("", description="Label selector of the eval pods (scale subresource, HPA).")
    restarts: int = Field(
        0, description="Restarts of the most-restarted eval replica, checked against evalBackoffLimit."
    )
    pod_restarts: dict[str, int] = Field(
        default_factory=dict, description="Bookkeeping: restart count last seen per live eval pod uid."
    )
    replica_restarts: dict[str, int] = Field(
        default_factory=dict, description="Bookkeeping: restarts per eval replica, across its pods."
    )


class NodeWeightStatus(_Status):
    node_name: str
    version: int = 0
    lag: int = Field(0, description="Newest published weight version minus the version loaded here.")
    workers: int = 0


class Progress(_Status):
    """The run's figures, from the coordinator (its other JobStatus figures are added as they are)."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="allow")

    epoch: int = 0
    max_epochs: int = 0
    env_steps: int = 0
    episodes: int = 0
    last_return: float | None = Field(None, description="Mean of the last 20 episode returns.")
    eval_return: float | None = Field(None, description="Mean return of the newest evaluation.")
    weight_version: int = Field(0, description="Newest published weight version.")
    loaded_version: int = Field(0, description="Weight version loaded on every node: the minimum over nodes.")
    last_sync_time: str | None = Field(None, description="When the newest weight version was published.")
    steps_per_second: float = 0.0
    max_weight_lag: int = Field(0, description="Largest per-node weight lag.")
    nodes: list[NodeWeightStatus] = Field(default_factory=list)
    fingerprints_consistent: bool = True


class LastFailure(_Status):
    reason: str = Field(description="The pod's reason (its termination message), e.g. PolicyNotRegistered.")
    message: str = Field("", description="What the pod said, at most 4096 bytes.")
    pod: str = ""
    exit_code: int = 0
    permanent: bool = Field(False, description="Whether no restart can fix it (the job failed at once).")
    time: str | None = Field(None, description="When the container stopped.")


class RLJobStatus(_Status):
    phase: Phase = Phase.PENDING
    message: str = ""
    observed_generation: int = 0
    conditions: list[Condition] = Field(default_factory=list)
    train: TrainStatus = Field(default_factory=TrainStatus)
    eval: EvalStatus = Field(default_factory=EvalStatus)
    progress: Progress = Field(default_factory=Progress)
    start_time: str | None = Field(None, description="When the job (last) started running unsuspended.")
    completion_time: str | None = Field(None, description="When the job became Complete or Failed.")
    last_failure: LastFailure | None = Field(
        None, description="The newest pod failure that said why (kept after the pods are cleaned)."
    )

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# Observations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleObservation:
    """One StatefulSet as observed: ``desired`` from its spec, the rest from its status."""

    exists: bool = False
    desired: int = 0
    current: int = 0
    ready: int = 0


@dataclass(frozen=True)
class PodFailure:
    """A container of one of the job's pods (of the current spec) that stopped and said why."""

    pod: str
    reason: str
    message: str
    permanent: bool
    exit_code: int = 1
    finished_at: str | None = None


@dataclass(frozen=True)
class Children:
    train: RoleObservation = RoleObservation()
    eval: RoleObservation = RoleObservation()
    #: Each live train pod, by uid: its rank and restartCount summed over its containers.
    train_pod_restarts: Mapping[str, PodRestarts] = field(default_factory=dict)
    #: Each live eval pod, by uid: its replica index and restartCount summed over its containers.
    eval_pod_restarts: Mapping[str, PodRestarts] = field(default_factory=dict)
    #: Failures the job's pods reported (termination messages), any order.
    failures: tuple[PodFailure, ...] = ()
    #: Ready train pods that run the current spec; None: not observed (counts as ``train.ready``).
    train_current_ready: int | None = None


@dataclass(frozen=True)
class NodeReport:
    node_name: str
    version: int
    lag: int
    workers: int


@dataclass(frozen=True)
class CoordinatorReport:
    """What the coordinator's ``GetStatus`` said, without the protobuf types.

    The fields named here are the ones derivation reads, decides with or reshapes; every other
    progress figure of ``JobStatus`` arrives in :attr:`shown` (see ``progress_fields``), so a new
    one needs no field here.
    """

    phase: CoordinatorPhase = CoordinatorPhase.STARTING
    epoch: int = 0
    max_epochs: int = 0
    env_steps: int = 0
    episodes: int = 0
    last_return: float | None = None
    eval_return: float | None = None
    weight_version: int = 0
    last_sync_time: float = 0.0  # unix seconds; 0: never published
    steps_per_second: float = 0.0
    nodes: tuple[NodeReport, ...] = ()
    finished: bool = False
    message: str = ""
    #: Why the coordinator failed the job (read only when ``phase`` is FAILED).
    failure_reason: EngineFailure = EngineFailure.TRAINING_FAILED
    fingerprints_consistent: bool = True
    #: JSON name -> value: the other JobStatus figures, shown in ``status.progress`` as they are.
    shown: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", CoordinatorPhase(self.phase))  # a phase given by its name
        object.__setattr__(self, "failure_reason", EngineFailure(self.failure_reason))


@dataclass(frozen=True)
class Transition:
    """A condition that flipped to True (or the phase that changed): one Kubernetes event each."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Derived:
    status: dict[str, Any]
    transitions: tuple[Transition, ...]

    @property
    def phase(self) -> Phase:
        return Phase(self.status["phase"])


# Derivation ----------------------------------------------------------------------------------


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def eval_selector(job_name: str) -> str:
    return f"{LABEL_JOB}={job_name},{LABEL_ROLE}={Role.EVAL.value}"


def read_status(raw: Mapping[str, Any] | None) -> RLJobStatus:
    """The previous status from an object body; a status we cannot read counts as none."""
    try:
        return RLJobStatus.model_validate(dict(raw or {}))
    except ValueError:
        return RLJobStatus()


def previous_status(raw: Mapping[str, Any] | None, *, generation: int) -> RLJobStatus:
    """What a derivation starts from: the stored status, or none for a new generation of a job that
    failed for its spec (so the fixed spec is run, not kept Failed)."""
    previous = read_status(raw)
    if generation > previous.observed_generation and previous.phase is Phase.FAILED:
        failed = _find(previous.conditions, ConditionType.FAILED)
        if failed is not None and failed.reason in SPEC_FAILURES:
            return RLJobStatus()
    return previous


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether ``new`` differs from the stored status (so a patch is needed)."""
    return read_status(previous).dump() != dict(new)


def derive_status(
    job: RLJob,
    children: Children,
    report: CoordinatorReport | None,
    *,
    now: datetime,
    generation: int | None = None,
) -> Derived:
    """The status the job should have now, and the transitions that lead there from ``job.status``:
    :func:`observe`, :func:`decide`, then the status document and its conditions' flips."""
    generation = generation if generation is not None else _generation(job)
    observed = observe(job, children, report, now=now, generation=generation)
    verdict = decide(observed)
    stamp = rfc3339(now)
    previous = observed.previous
    conditions, transitions = _merge_conditions(
        previous.conditions, verdict.conditions, stamp=stamp, generation=generation
    )
    completion_time = previous.completion_time
    if verdict.terminal and completion_time is None:
        completion_time = stamp
    status = RLJobStatus(
        phase=verdict.phase,
        message=verdict.message,
        observed_generation=generation,
        conditions=conditions,
        train=observed.train,
        eval=observed.evals,
        progress=observed.progress,
        start_time=observed.start_time,
        completion_time=completion_time,
        last_failure=observed.last_failure,
    )
    return Derived(status=status.dump(), transitions=tuple(transitions))


# Detect: what was observed, in one frozen value ----------------------------------------------


@dataclass(frozen=True)
class Observed:
    """Everything :func:`decide` reads: the spec, the status derived last time, and what the
    children and the coordinator say now, the restart ledgers already brought up to date."""

    job_name: str
    spec: RLJobSpec
    previous: RLJobStatus
    report: CoordinatorReport | None
    now: datetime
    train: TrainStatus
    evals: EvalStatus
    #: Restarts per eval replica index (the ledger's own order: it names the worst replica).
    eval_replica_restarts: Mapping[int, int]
    progress: Progress
    #: Whether a train rank restarted since the previous status.
    restarted_now: bool
    suspended: bool
    #: Unsuspended since the previous status.
    resumed: bool
    start_time: str | None
    #: Every train rank ready.
    train_ready: bool
    #: Every train rank ready on the current spec (a spec change's new pods).
    train_on_new_spec: bool
    last_failure: LastFailure | None
    #: The oldest failure no restart can fix, if any.
    permanent: PodFailure | None


def observe(
    job: RLJob,
    children: Children,
    report: CoordinatorReport | None,
    *,
    now: datetime,
    generation: int,
) -> Observed:
    """What :func:`decide` needs, from the job, its previous status, its children and the report."""
    spec = job.spec
    previous = previous_status(job.status, generation=generation)
    train_desired = spec.trainer.replicas
    ledger = _ledger(previous.train).observe(children.train_pod_restarts)
    train = TrainStatus(
        replicas=children.train.current,
        ready_replicas=children.train.ready,
        ready=f"{children.train.ready}/{train_desired}",
        restarts=ledger.group_restarts,
        pod_restarts=dict(ledger.last_seen),
        rank_restarts={str(rank): count for rank, count in sorted(ledger.per_rank.items())},
    )
    eval_ledger = RestartLedger(
        {int(i): n for i, n in previous.eval.replica_restarts.items()}, dict(previous.eval.pod_restarts)
    ).observe(children.eval_pod_restarts)
    evals = EvalStatus(
        replicas=children.eval.current,
        ready_replicas=children.eval.ready,
        ready=f"{children.eval.ready}/{spec.evaluator.replicas}",
        selector=eval_selector(job.name),
        restarts=eval_ledger.group_restarts,  # the most-restarted replica
        pod_restarts=dict(eval_ledger.last_seen),
        replica_restarts={str(i): n for i, n in sorted(eval_ledger.per_rank.items())},
    )
    suspended = spec.run_policy.suspend
    resumed = not suspended and previous.phase is Phase.SUSPENDED
    start_time = previous.start_time
    if not suspended and (start_time is None or resumed):
        start_time = rfc3339(now)
    train_ready = train_desired > 0 and children.train.ready >= train_desired
    current_ready = (
        children.train.ready if children.train_current_ready is None else children.train_current_ready
    )
    return Observed(
        job_name=job.name,
        spec=spec,
        previous=previous,
        report=report,
        now=now,
        train=train,
        evals=evals,
        eval_replica_restarts=dict(eval_ledger.per_rank),
        progress=_progress(previous.progress, report),
        restarted_now=ledger.per_rank != _ledger(previous.train).per_rank,
        suspended=suspended,
        resumed=resumed,
        start_time=start_time,
        train_ready=train_ready,
        train_on_new_spec=train_ready and current_ready >= train_desired,
        last_failure=_last_failure(previous.last_failure, children.failures),
        permanent=next((f for f in sorted(children.failures, key=_failure_order) if f.permanent), None),
    )


def _last_failure(previous: LastFailure | None, failures: tuple[PodFailure, ...]) -> LastFailure | None:
    newest = max(failures, key=_failure_order, default=None)
    if newest is None:
        return previous
    return LastFailure(
        reason=newest.reason,
        message=newest.message,
        pod=newest.pod,
        exit_code=newest.exit_code,
        permanent=newest.permanent,
        time=newest.finished_at,
    )


def _failure_order(failure: PodFailure) -> tuple[str, str]:
    return (failure.finished_at or "", failure.pod)


# Decide: one frozen verdict ------------------------------------------------------------------


class Wanted(NamedTuple):
    """What one condition should say now."""

    true: bool
    reason: Reason
    message: str


@dataclass(frozen=True)
class Terminal:
    """A terminal outcome: the job is Complete or Failed, and stays so."""

    phase: Phase
    reason: Reason
    message: str


@dataclass(frozen=True)
class Verdict:
    """What :func:`decide` concluded: the phase, its message and what each condition says."""

    phase: Phase
    message: str
    terminal: Terminal | None
    conditions: Mapping[ConditionType, Wanted]


def decide(observed: Observed) -> Verdict:
    """The phase and conditions that ``observed`` calls for: the first terminal rule that holds
    (:data:`TERMINAL_RULES`), else restarting, running or waiting. Pure."""
    terminal = next((t for rule in TERMINAL_RULES if (t := rule(observed)) is not None), None)
    restarting = _is_restarting(observed, terminal)
    running = _is_running(observed, terminal, restarting)
    conditions = {
        ConditionType.SUSPENDED: _suspended_condition(observed),
        ConditionType.TRAIN_READY: _train_ready_condition(observed),
        ConditionType.EVAL_AVAILABLE: _eval_available_condition(observed),
        ConditionType.RUNNING: _running_condition(observed, terminal, running),
        ConditionType.RESTARTING: _restarting_condition(observed, restarting),
        ConditionType.COMPLETE: _terminal_condition(terminal, Phase.COMPLETE, Reason.NOT_FINISHED),
        ConditionType.FAILED: _terminal_condition(terminal, Phase.FAILED, Reason.NO_FAILURE),
    }
    if terminal:
        phase, message = terminal.phase, terminal.message
    elif observed.suspended:
        phase, message = Phase.SUSPENDED, conditions[ConditionType.SUSPENDED].message
    elif restarting:
        phase, message = Phase.RESTARTING, conditions[ConditionType.RESTARTING].message
    elif running:
        phase, message = Phase.RUNNING, conditions[ConditionType.RUNNING].message
    else:
        phase, message = Phase.PENDING, conditions[ConditionType.RUNNING].message
    return Verdict(phase=phase, message=message, terminal=terminal, conditions=conditions)


# The terminal rules, most specific first; a terminal phase never changes again.


def _stays_terminal(o: Observed) -> Terminal | None:
    previous = o.previous
    if not previous.phase.is_terminal():
        return None
    old = _find(previous.conditions, ConditionType(previous.phase.value))
    if old is None:
        return Terminal(previous.phase, Reason.JOB_FINISHED, previous.message)
    return Terminal(previous.phase, old.reason, old.message)


def _coordinator_failed(o: Observed) -> Terminal | None:
    if o.report is None or o.report.phase is not CoordinatorPhase.FAILED:
        return None
    # The cause travels as an enum (JobStatus.failure_reason); the message only says it.
    reason = Reason(o.report.failure_reason.value)
    return Terminal(Phase.FAILED, reason, o.report.message or "the coordinator reported a failure")


def _training_finished(o: Observed) -> Terminal | None:
    report = o.report
    if report is None or not (report.finished or report.phase is CoordinatorPhase.COMPLETE):
        return None
    summary = f"trained {report.epoch} epochs, {report.env_steps} env steps"
    if report.last_return is not None:
        summary += f", last return {report.last_return:.1f}"
    return Terminal(Phase.COMPLETE, Reason.TRAINING_FINISHED, summary)


def _permanent_pod_failure(o: Observed) -> Terminal | None:
    failure = o.permanent
    if failure is None:
        return None
    return Terminal(Phase.FAILED, _failure_reason(failure.reason), f"{failure.pod}: {failure.message}")


def _backoff_limit_exceeded(o: Observed) -> Terminal | None:
    limit = o.spec.run_policy.backoff_limit
    if not run_policy.backoff_exceeded(o.train.restarts, limit):
        return None
    message = run_policy.backoff_message(o.train.restarts, limit)
    return Terminal(Phase.FAILED, Reason.BACKOFF_LIMIT_EXCEEDED, message + _last_failure_note(o))


def _eval_backoff_limit_exceeded(o: Observed) -> Terminal | None:
    limit = o.spec.run_policy.eval_backoff_limit
    if not run_policy.backoff_exceeded(o.evals.restarts, limit):
        return None
    per_replica = o.eval_replica_restarts
    replica = max(per_replica, key=lambda i: per_replica[i])
    pod = f"{eval_statefulset_name(o.job_name)}-{replica}"
    message = run_policy.eval_backoff_message(pod, o.evals.restarts, limit)
    return Terminal(Phase.FAILED, Reason.EVAL_BACKOFF_LIMIT_EXCEEDED, message + _last_failure_note(o))


def _deadline_exceeded(o: Observed) -> Terminal | None:
    deadline = o.spec.run_policy.active_deadline_seconds
    if o.suspended or deadline is None or not run_policy.is_due(parse_time(o.start_time), deadline, o.now):
        return None
    return Terminal(Phase.FAILED, Reason.DEADLINE_EXCEEDED, run_policy.deadline_message(deadline))


#: Tried in order by :func:`decide`; the first that holds ends the job.
TERMINAL_RULES: tuple[Callable[[Observed], Terminal | None], ...] = (
    _stays_terminal,
    _coordinator_failed,
    _training_finished,
    _permanent_pod_failure,
    _backoff_limit_exceeded,
    _eval_backoff_limit_exceeded,
    _deadline_exceeded,
)


def _last_failure_note(o: Observed) -> str:
    failure = o.last_failure
    return f"; last failure: {failure.reason}: {failure.message}" if failure else ""


def _failure_reason(reason: str) -> Reason:
    try:
        return Reason(reason)
    except ValueError:
        return Reason.POD_FAILED


# What is going on when nothing terminal holds.


def _is_restarting(o: Observed, terminal: Terminal | None) -> bool:
    if terminal or o.suspended:
        return False
    return o.restarted_now or (_is_true(o.previous, "Restarting") and not o.train_on_new_spec)


def _is_running(o: Observed, terminal: Terminal | None, restarting: bool) -> bool:
    return (
        not terminal
        and not o.suspended
        and o.report is not None
        and o.report.phase is not CoordinatorPhase.STARTING
        and not restarting
    )


# One function per condition.


def _suspended_condition(o: Observed) -> Wanted:
    if o.suspended:
        return Wanted(True, Reason.JOB_SUSPENDED, "runPolicy.suspend is true: scaled to zero")
    if o.resumed:
        return Wanted(False, Reason.JOB_RESUMED, "runPolicy.suspend is false: resumed")
    old = _find(o.previous.conditions, ConditionType.SUSPENDED)
    return Wanted(False, old.reason if old and old.status == "False" else Reason.NOT_SUSPENDED, "")


def _train_ready_condition(o: Observed) -> Wanted:
    message = f"{o.train.ready} train ranks ready"
    if o.train_ready:
        return Wanted(True, Reason.ALL_TRAIN_RANKS_READY, message)
    return Wanted(False, Reason.TRAIN_RANKS_NOT_READY, message)


def _eval_available_condition(o: Observed) -> Wanted:
    ready = o.evals.ready_replicas
    if o.spec.evaluator.replicas == 0 and ready == 0:
        return Wanted(False, Reason.EVAL_SCALED_TO_ZERO, "spec.evaluator.replicas is 0")
    if ready > 0:
        return Wanted(True, Reason.EVAL_REPLICAS_AVAILABLE, f"{o.evals.ready} eval replicas ready")
    return Wanted(False, Reason.NO_EVAL_REPLICAS_READY, f"{o.evals.ready} ready")


def _running_condition(o: Observed, terminal: Terminal | None, running: bool) -> Wanted:
    if running:
        assert o.report is not None
        return Wanted(True, Reason.TRAINING, f"epoch {o.report.epoch}/{o.report.max_epochs}")
    if terminal:
        return Wanted(False, Reason.JOB_FINISHED, f"the job is {terminal.phase.value}")
    if o.suspended:
        return Wanted(False, Reason.JOB_SUSPENDED, "suspended")
    if not o.train_ready:
        return Wanted(False, Reason.WAITING_FOR_TRAIN_RANKS, f"{o.train.ready} ready")
    return Wanted(
        False,
        Reason.WAITING_FOR_COORDINATOR,
        "train ranks are ready; the coordinator has not reported training yet",
    )


def _restarting_condition(o: Observed, restarting: bool) -> Wanted:
    old = _find(o.previous.conditions, ConditionType.RESTARTING)
    if restarting and not o.restarted_now and old is not None and old.reason is Reason.SPEC_CHANGED:
        return Wanted(True, Reason.SPEC_CHANGED, old.message)  # until every rank runs the new spec
    if restarting:
        return Wanted(
            True,
            Reason.TRAIN_POD_RESTARTED,
            f"the train group restarted {o.train.restarts} times (runPolicy.backoffLimit "
            f"{o.spec.run_policy.backoff_limit})",
        )
    if _is_true(o.previous, "Restarting"):
        return Wanted(False, Reason.RECOVERED, "all train ranks are ready again")
    return Wanted(False, old.reason if old else Reason.NO_RESTARTS, "")


def _terminal_condition(terminal: Terminal | None, phase: Phase, otherwise: Reason) -> Wanted:
    """``Complete`` or ``Failed``: true with the terminal rule's reason when it ended the job so."""
    if terminal and terminal.phase is phase:
        return Wanted(True, terminal.reason, terminal.message)
    return Wanted(False, otherwise, "")


# Other derivations ---------------------------------------------------------------------------


def spec_change_status(
    previous_raw: Mapping[str, Any] | None, fields: list[str], *, generation: int, now: datetime
) -> Derived:
    """``Restarting`` with reason ``SpecChanged`` naming ``fields``: a change that replaces the train pods.

    :func:`derive_status` keeps it until every train rank is ready on the new spec.
    """
    previous = read_status(previous_raw)
    message = f"{', '.join(fields)} changed: the train pods are replaced and training restarts"
    wanted = {
        c.type: Wanted(c.status == "True", c.reason, c.message)
        for c in previous.conditions
        if c.type in CONDITION_ORDER
    }
    for ctype in CONDITION_ORDER:
        wanted.setdefault(ctype, Wanted(False, _default_reason(ctype), ""))
    wanted[ConditionType.RESTARTING] = Wanted(True, Reason.SPEC_CHANGED, message)
    conditions, transitions = _merge_conditions(
        previous.conditions, wanted, stamp=rfc3339(now), generation=generation
    )
    status = previous.model_copy(
        update={"phase": Phase.RESTARTING, "message": message, "conditions": conditions}
    )
    return Derived(status=status.dump(), transitions=tuple(transitions))


def next_decision(job: RLJob, *, generation: int | None = None) -> datetime | None:
    """When the run policy next decides something by the clock alone: the TTL of a finished job
    runs out, or a running job passes ``activeDeadlineSeconds``. None: nothing is due."""
    generation = generation if generation is not None else _generation(job)
    status = previous_status(job.status, generation=generation)
    policy = job.spec.run_policy
    if status.phase.is_terminal():
        finished = parse_time(status.completion_time)
        ttl = policy.ttl_seconds_after_finished
        return finished + timedelta(seconds=ttl) if finished is not None and ttl is not None else None
    started = parse_time(status.start_time)
    if policy.suspend or started is None or not policy.active_deadline_seconds:
        return None
    return started + timedelta(seconds=policy.active_deadline_seconds)


def invalid_spec_status(
    previous_raw: Mapping[str, Any] | None, problems: list[str], *, generation: int, now: datetime
) -> Derived:
    """``Failed`` with reason ``InvalidSpec`` for a spec the schema let through but spec.py refuses."""
    previous = previous_status(previous_raw, generation=generation)
    message = "; ".join(problems)
    wanted = {
        ctype: Wanted(
            False, Reason.INVALID_SPEC if ctype is ConditionType.RUNNING else _default_reason(ctype), ""
        )
        for ctype in CONDITION_ORDER
    }
    wanted[ConditionType.FAILED] = Wanted(True, Reason.INVALID_SPEC, message)
    stamp = rfc3339(now)
    conditions, transitions = _merge_conditions(
        previous.conditions, wanted, stamp=stamp, generation=generation
    )
    status = previous.model_copy(
        update={
            "phase": Phase.FAILED,
            "message": message,
            "observed_generation": generation,
            "conditions": conditions,
            "completion_time": previous.completion_time or stamp,
        }
    )
    return Derived(status=status.dump(), transitions=tuple(transitions))


def _default_reason(ctype: ConditionType) -> Reason:
    return {
        ConditionType.SUSPENDED: Reason.NOT_SUSPENDED,
        ConditionType.TRAIN_READY: Reason.TRAIN_RANKS_NOT_READY,
        ConditionType.EVAL_AVAILABLE: Reason.NO_EVAL_REPLICAS_READY,
        ConditionType.RUNNING: Reason.WAITING_FOR_TRAIN_RANKS,
        ConditionType.RESTARTING: Reason.NO_RESTARTS,
        ConditionType.COMPLETE: Reason.NOT_FINISHED,
        ConditionType.FAILED: Reason.NO_FAILURE,
    }[ctype]


def _merge_conditions(
    previous: list[Condition],
    wanted: Mapping[ConditionType, Wanted],
    *,
    stamp: str,
    generation: int,
) -> tuple[list[Condition], list[Transition]]:
    conditions: list[Condition] = []
    transitions: list[Transition] = []
    for ctype in CONDITION_ORDER:
        value, reason, message = wanted[ctype]
        text = "True" if value else "False"
        old = _find(previous, ctype)
        flipped = old is None or old.status != text
        conditions.append(
            Condition(
                type=ctype,
                status=text,
                reason=reason,
                message=message,
                last_transition_time=stamp if flipped or old is None else old.last_transition_time,
                observed_generation=generation,
            )
        )
        # An event for every flip to True, and for a flip back to False that has something to say.
        if flipped and (value or (old is not None and reason in _EVENTFUL_FALSE)):
            transitions.append(
                Transition(
                    reason=reason.value,
                    message=f"{ctype.value}: {message}".rstrip(": "),
                    warning=value and ctype in WARNING_CONDITIONS,
                )
            )
    return conditions, transitions


_EVENTFUL_FALSE = frozenset({Reason.JOB_RESUMED, Reason.RECOVERED, Reason.TRAIN_RANKS_NOT_READY})


def _find(conditions: list[Condition], ctype: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type is ctype), None)


def _is_true(status: RLJobStatus, ctype: str) -> bool:
    found = _find(status.conditions, ConditionType(ctype))
    return bool(found and found.status == "True")


def _ledger(previous: TrainStatus) -> RestartLedger:
    """The restart ledger kept in status (rank keys are strings there)."""
    return RestartLedger(
        {int(rank): count for rank, count in previous.rank_restarts.items()}, dict(previous.pod_restarts)
    )


def _progress(previous: Progress, report: CoordinatorReport | None) -> Progress:
    if report is None or report.phase is CoordinatorPhase.STARTING:
        # Not answering, or a restarted rank 0 that has not resumed its checkpoint yet: keep the
        # last figures we had rather than show the job back at epoch 0.
        return previous
    nodes = [
        NodeWeightStatus(node_name=n.node_name, version=n.version, lag=n.lag, workers=n.workers)
        for n in sorted(report.nodes, key=lambda n: n.node_name)
    ]
    return Progress(
        **report.shown,
        epoch=report.epoch,
        max_epochs=report.max_epochs,
        env_steps=report.env_steps,
        episodes=report.episodes,
        last_return=_rounded(report.last_return),
        eval_return=_rounded(report.eval_return),
        weight_version=report.weight_version,
        loaded_version=min((n.version for n in report.nodes), default=0),
        last_sync_time=(
            rfc3339(datetime.fromtimestamp(report.last_sync_time, UTC)) if report.last_sync_time > 0 else None
        ),
        steps_per_second=round(report.steps_per_second, 1),
        max_weight_lag=max((n.lag for n in report.nodes), default=0),
        nodes=nodes,
        fingerprints_consistent=report.fingerprints_consistent,
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _generation(job: RLJob) -> int:
    extra = job.metadata.model_extra or {}
    try:
        return int(extra.get("generation", 0))
    except (TypeError, ValueError):
        return 0


def status_patch(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch that turns ``previous`` into ``new`` (keys that went away become null)."""
    old = dict(previous or {})
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = status_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    return patch

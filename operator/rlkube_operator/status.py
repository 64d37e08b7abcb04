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

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from rlkube import run_policy
from rlkube.contract import (
    LABEL_JOB,
    LABEL_ROLE,
    PERMANENT_FAILURES,
    CoordinatorPhase,
    FailureReason,
    Role,
    eval_statefulset_name,
)
from rlkube.run_policy import PodRestarts, RestartLedger
from rlkube.spec import RLJob


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
    TRAINING_FAILED = "TrainingFailed"
    INVALID_SPEC = "InvalidSpec"
    NO_FAILURE = "NoFailure"
    JOB_FINISHED = "JobFinished"
    NON_FINITE_WEIGHTS = "NonFiniteWeights"
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
    fingerprints_consistent: bool = True
    #: JSON name -> value: the other JobStatus figures, shown in ``status.progress`` as they are.
    shown: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", CoordinatorPhase(self.phase))  # a phase given by its name


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
    """The status the job should have now, and the transitions that lead there from ``job.status``."""
    spec = job.spec
    generation = generation if generation is not None else _generation(job)
    previous = previous_status(job.status, generation=generation)
    stamp = rfc3339(now)

    train_desired = spec.trainer.replicas
    eval_desired = spec.evaluator.replicas
    ledger = _ledger(previous.train).observe(children.train_pod_restarts)
    restarts = ledger.group_restarts
    restarted_now = ledger.per_rank != _ledger(previous.train).per_rank
    train = TrainStatus(
        replicas=children.train.current,
        ready_replicas=children.train.ready,
        ready=f"{children.train.ready}/{train_desired}",
        restarts=restarts,
        pod_restarts=dict(ledger.last_seen),
        rank_restarts={str(rank): count for rank, count in sorted(ledger.per_rank.items())},
    )
    eval_ledger = RestartLedger(
        {int(i): n for i, n in previous.eval.replica_restarts.items()}, dict(previous.eval.pod_restarts)
    ).observe(children.eval_pod_restarts)
    eval_restarts = eval_ledger.group_restarts  # the most-restarted replica
    evals = EvalStatus(
        replicas=children.eval.current,
        ready_replicas=children.eval.ready,
        ready=f"{children.eval.ready}/{eval_desired}",
        selector=eval_selector(job.name),
        restarts=eval_restarts,
        pod_restarts=dict(eval_ledger.last_seen),
        replica_restarts={str(i): n for i, n in sorted(eval_ledger.per_rank.items())},
    )
    progress = _progress(previous.progress, report)

    suspended = spec.run_policy.suspend
    resumed = not suspended and previous.phase is Phase.SUSPENDED
    start_time = previous.start_time
    if not suspended and (start_time is None or resumed):
        start_time = stamp
    train_ready = train_desired > 0 and children.train.ready >= train_desired
    current_ready = (
        children.train.ready if children.train_current_ready is None else children.train_current_ready
    )
    train_on_new_spec = train_ready and current_ready >= train_desired
    newest = _newest_failure(children.failures)
    last_failure = previous.last_failure
    if newest is not None:
        last_failure = LastFailure(
            reason=newest.reason,
            message=newest.message,
            pod=newest.pod,
            exit_code=newest.exit_code,
            permanent=newest.permanent,
            time=newest.finished_at,
        )
    permanent = next((f for f in sorted(children.failures, key=_failure_order) if f.permanent), None)

    # Terminal outcomes, most specific first; a terminal phase never changes again.
    terminal: tuple[Phase, Reason, str] | None = None
    if previous.phase.is_terminal():
        old = _find(previous.conditions, ConditionType(previous.phase.value))
        reason = old.reason if old else Reason.JOB_FINISHED
        terminal = (previous.phase, reason, old.message if old else previous.message)
    elif report is not None and report.phase is CoordinatorPhase.FAILED:
        terminal = (
            Phase.FAILED,
            # The coordinator names a known cause as the first word of its message.
            Reason.NON_FINITE_WEIGHTS
            if report.message.startswith(Reason.NON_FINITE_WEIGHTS.value)
            else Reason.TRAINING_FAILED,
            report.message or "the coordinator reported a failure",
        )
    elif report is not None and (report.finished or report.phase is CoordinatorPhase.COMPLETE):
        summary = f"trained {report.epoch} epochs, {report.env_steps} env steps"
        if report.last_return is not None:
            summary += f", last return {report.last_return:.1f}"
        terminal = (Phase.COMPLETE, Reason.TRAINING_FINISHED, summary)
    elif permanent is not None:
        terminal = (Phase.FAILED, _failure_reason(permanent.reason), f"{permanent.pod}: {permanent.message}")
    elif run_policy.backoff_exceeded(restarts, spec.run_policy.backoff_limit):
        why = f"; last failure: {last_failure.reason}: {last_failure.message}" if last_failure else ""
        terminal = (
            Phase.FAILED,
            Reason.BACKOFF_LIMIT_EXCEEDED,
            run_policy.backoff_message(restarts, spec.run_policy.backoff_limit) + why,
        )
    elif run_policy.backoff_exceeded(eval_restarts, spec.run_policy.eval_backoff_limit):
        replica = max(eval_ledger.per_rank, key=lambda i: eval_ledger.per_rank[i])
        why = f"; last failure: {last_failure.reason}: {last_failure.message}" if last_failure else ""
        terminal = (
            Phase.FAILED,
            Reason.EVAL_BACKOFF_LIMIT_EXCEEDED,
            run_policy.eval_backoff_message(
                f"{eval_statefulset_name(job.name)}-{replica}",
                eval_restarts,
                spec.run_policy.eval_backoff_limit,
            )
            + why,
        )
    elif (
        not suspended
        and spec.run_policy.active_deadline_seconds is not None
        and run_policy.is_due(parse_time(start_time), spec.run_policy.active_deadline_seconds, now)
    ):
        terminal = (
            Phase.FAILED,
            Reason.DEADLINE_EXCEEDED,
            run_policy.deadline_message(spec.run_policy.active_deadline_seconds),
        )

    restarting = (
        not terminal
        and not suspended
        and (restarted_now or (_is_true(previous, "Restarting") and not train_on_new_spec))
    )
    old_restarting = _find(previous.conditions, ConditionType.RESTARTING)
    spec_changed = (
        restarting
        and not restarted_now
        and old_restarting is not None
        and old_restarting.reason is Reason.SPEC_CHANGED
    )
    running = (
        not terminal
        and not suspended
        and report is not None
        and report.phase is not CoordinatorPhase.STARTING
        and not restarting
    )

    wanted: dict[ConditionType, tuple[bool, Reason, str]] = {}
    if suspended:
        wanted[ConditionType.SUSPENDED] = (
            True,
            Reason.JOB_SUSPENDED,
            "runPolicy.suspend is true: scaled to zero",
        )
    elif resumed:
        wanted[ConditionType.SUSPENDED] = (False, Reason.JOB_RESUMED, "runPolicy.suspend is false: resumed")
    else:
        old = _find(previous.conditions, ConditionType.SUSPENDED)
        reason = old.reason if old and old.status == "False" else Reason.NOT_SUSPENDED
        wanted[ConditionType.SUSPENDED] = (False, reason, "")
    wanted[ConditionType.TRAIN_READY] = (
        (True, Reason.ALL_TRAIN_RANKS_READY, f"{train.ready} train ranks ready")
        if train_ready
        else (False, Reason.TRAIN_RANKS_NOT_READY, f"{train.ready} train ranks ready")
    )
    if eval_desired == 0 and children.eval.ready == 0:
        wanted[ConditionType.EVAL_AVAILABLE] = (
            False,
            Reason.EVAL_SCALED_TO_ZERO,
            "spec.evaluator.replicas is 0",
        )
    elif children.eval.ready > 0:
        wanted[ConditionType.EVAL_AVAILABLE] = (
            True,
            Reason.EVAL_REPLICAS_AVAILABLE,
            f"{evals.ready} eval replicas ready",
        )
    else:
        wanted[ConditionType.EVAL_AVAILABLE] = (False, Reason.NO_EVAL_REPLICAS_READY, f"{evals.ready} ready")
    if running:
        assert report is not None
        wanted[ConditionType.RUNNING] = (True, Reason.TRAINING, f"epoch {report.epoch}/{report.max_epochs}")
    elif terminal:
        wanted[ConditionType.RUNNING] = (False, Reason.JOB_FINISHED, f"the job is {terminal[0].value}")
    elif suspended:
        wanted[ConditionType.RUNNING] = (False, Reason.JOB_SUSPENDED, "suspended")
    elif not train_ready:
        wanted[ConditionType.RUNNING] = (False, Reason.WAITING_FOR_TRAIN_RANKS, f"{train.ready} ready")
    else:
        wanted[ConditionType.RUNNING] = (
            False,
            Reason.WAITING_FOR_COORDINATOR,
            "train ranks are ready; the coordinator has not reported training yet",
        )
    if spec_changed:
        assert old_restarting is not None
        wanted[ConditionType.RESTARTING] = (True, Reason.SPEC_CHANGED, old_restarting.message)
    elif restarting:
        wanted[ConditionType.RESTARTING] = (
            True,
            Reason.TRAIN_POD_RESTARTED,
            f"the train group restarted {restarts} times (runPolicy.backoffLimit "
            f"{spec.run_policy.backoff_limit})",
        )
    elif _is_true(previous, "Restarting"):
        wanted[ConditionType.RESTARTING] = (False, Reason.RECOVERED, "all train ranks are ready again")
    else:
        old = _find(previous.conditions, ConditionType.RESTARTING)
        wanted[ConditionType.RESTARTING] = (False, old.reason if old else Reason.NO_RESTARTS, "")
    if terminal and terminal[0] is Phase.COMPLETE:
        wanted[ConditionType.COMPLETE] = (True, terminal[1], terminal[2])
    else:
        wanted[ConditionType.COMPLETE] = (False, Reason.NOT_FINISHED, "")
    if terminal and terminal[0] is Phase.FAILED:
        wanted[ConditionType.FAILED] = (True, terminal[1], terminal[2])
    else:
        wanted[ConditionType.FAILED] = (False, Reason.NO_FAILURE, "")

    conditions, transitions = _merge_conditions(
        previous.conditions, wanted, stamp=stamp, generation=generation
    )

    if terminal:
        phase, message = terminal[0], terminal[2]
    elif suspended:
        phase, message = Phase.SUSPENDED, wanted[ConditionType.SUSPENDED][2]
    elif restarting:
        phase, message = Phase.RESTARTING, wanted[ConditionType.RESTARTING][2]
    elif running:
        phase, message = Phase.RUNNING, wanted[ConditionType.RUNNING][2]
    else:
        phase, message = Phase.PENDING, wanted[ConditionType.RUNNING][2]

    completion_time = previous.completion_time
    if terminal and completion_time is None:
        completion_time = stamp
    status = RLJobStatus(
        phase=phase,
        message=message,
        observed_generation=generation,
        conditions=conditions,
        train=train,
        eval=evals,
        progress=progress,
        start_time=start_time,
        completion_time=completion_time,
        last_failure=last_failure,
    )
    return Derived(status=status.dump(), transitions=tuple(transitions))


def _failure_order(failure: PodFailure) -> tuple[str, str]:
    return (failure.finished_at or "", failure.pod)


def _newest_failure(failures: tuple[PodFailure, ...]) -> PodFailure | None:
    return max(failures, key=_failure_order, default=None)


def _failure_reason(reason: str) -> Reason:
    try:
        return Reason(reason)
    except ValueError:
        return Reason.POD_FAILED


def spec_change_status(
    previous_raw: Mapping[str, Any] | None, fields: list[str], *, generation: int, now: datetime
) -> Derived:
    """``Restarting`` with reason ``SpecChanged`` naming ``fields``: a change that replaces the train pods.

    :func:`derive_status` keeps it until every train rank is ready on the new spec.
    """
    previous = read_status(previous_raw)
    message = f"{', '.join(fields)} changed: the train pods are replaced and training restarts"
    wanted = {
        c.type: (c.status == "True", c.reason, c.message)
        for c in previous.conditions
        if c.type in CONDITION_ORDER
    }
    for ctype in CONDITION_ORDER:
        wanted.setdefault(ctype, (False, _default_reason(ctype), ""))
    wanted[ConditionType.RESTARTING] = (True, Reason.SPEC_CHANGED, message)
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
        ctype: (False, Reason.INVALID_SPEC if ctype is ConditionType.RUNNING else _default_reason(ctype), "")
        for ctype in CONDITION_ORDER
    }
    wanted[ConditionType.FAILED] = (True, Reason.INVALID_SPEC, message)
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
    wanted: Mapping[ConditionType, tuple[bool, Reason, str]],
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

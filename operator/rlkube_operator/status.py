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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from rlkube import run_policy
from rlkube.contract import LABEL_JOB, LABEL_ROLE, Role
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
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    TRAINING_FAILED = "TrainingFailed"
    INVALID_SPEC = "InvalidSpec"
    NO_FAILURE = "NoFailure"
    JOB_FINISHED = "JobFinished"
    NON_FINITE_WEIGHTS = "NonFiniteWeights"


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


class NodeWeightStatus(_Status):
    node_name: str
    version: int = 0
    lag: int = Field(0, description="Newest published weight version minus the version loaded here.")
    workers: int = 0


class Progress(_Status):
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
class Children:
    train: RoleObservation = RoleObservation()
    eval: RoleObservation = RoleObservation()
    #: Each live train pod, by uid: its rank and restartCount summed over its containers.
    train_pod_restarts: Mapping[str, PodRestarts] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeReport:
    node_name: str
    version: int
    lag: int
    workers: int


@dataclass(frozen=True)
class CoordinatorReport:
    """What the coordinator's ``GetStatus`` said, without the protobuf types."""

    phase: str = "Starting"
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
    previous = read_status(job.status)
    spec = job.spec
    generation = generation if generation is not None else _generation(job)
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
    evals = EvalStatus(
        replicas=children.eval.current,
        ready_replicas=children.eval.ready,
        ready=f"{children.eval.ready}/{eval_desired}",
        selector=eval_selector(job.name),
    )
    progress = _progress(previous.progress, report)

    suspended = spec.run_policy.suspend
    resumed = not suspended and previous.phase is Phase.SUSPENDED
    start_time = previous.start_time
    if not suspended and (start_time is None or resumed):
        start_time = stamp
    train_ready = train_desired > 0 and children.train.ready >= train_desired

    # Terminal outcomes, most specific first; a terminal phase never changes again.
    terminal: tuple[Phase, Reason, str] | None = None
    if previous.phase.is_terminal():
        old = _find(previous.conditions, ConditionType(previous.phase.value))
        reason = old.reason if old else Reason.JOB_FINISHED
        terminal = (previous.phase, reason, old.message if old else previous.message)
    elif report is not None and report.phase == "Failed":
        terminal = (
            Phase.FAILED,
            # The coordinator names a known cause as the first word of its message.
            Reason.NON_FINITE_WEIGHTS
            if report.message.startswith(Reason.NON_FINITE_WEIGHTS.value)
            else Reason.TRAINING_FAILED,
            report.message or "the coordinator reported a failure",
        )
    elif report is not None and (report.finished or report.phase == "Complete"):
        summary = f"trained {report.epoch} epochs, {report.env_steps} env steps"
        if report.last_return is not None:
            summary += f", last return {report.last_return:.1f}"
        terminal = (Phase.COMPLETE, Reason.TRAINING_FINISHED, summary)
    elif run_policy.backoff_exceeded(restarts, spec.run_policy.backoff_limit):
        terminal = (
            Phase.FAILED,
            Reason.BACKOFF_LIMIT_EXCEEDED,
            run_policy.backoff_message(restarts, spec.run_policy.backoff_limit),
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
        and (restarted_now or (_is_true(previous, "Restarting") and not train_ready))
    )
    running = (
        not terminal
        and not suspended
        and report is not None
        and report.phase not in ("Starting", "")
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
    if restarting:
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
    )
    return Derived(status=status.dump(), transitions=tuple(transitions))


def invalid_spec_status(
    previous_raw: Mapping[str, Any] | None, problems: list[str], *, generation: int, now: datetime
) -> Derived:
    """``Failed`` with reason ``InvalidSpec`` for a spec the schema let through but spec.py refuses."""
    previous = read_status(previous_raw)
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
    if report is None or report.phase in ("", "Starting"):
        # Not answering, or a restarted rank 0 that has not resumed its checkpoint yet: keep the
        # last figures we had rather than show the job back at epoch 0.
        return previous
    nodes = [
        NodeWeightStatus(node_name=n.node_name, version=n.version, lag=n.lag, workers=n.workers)
        for n in sorted(report.nodes, key=lambda n: n.node_name)
    ]
    return Progress(
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

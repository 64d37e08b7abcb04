"""What one reconcile does, between the kopf handlers and the pure modules (blocking I/O).

Each method reads the RLJob body it is given, calls :mod:`render` or :mod:`status`, talks to
the API server through :class:`Kube` (and to the coordinator through :mod:`coordinator`), and
returns an :class:`Outcome`: the status patch and the events for the handler to publish. kopf is
not imported here, so tests drive a :class:`Reconciler` with a fake ``Kube``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from rlkube import contract as c
from rlkube import run_policy
from rlkube.contract import Role
from rlkube.run_policy import PodRestarts
from rlkube.security.credential import new_token
from rlkube.spec import CleanPodPolicy, RLJob, SpecError, parse_job

from rlkube_operator import metrics
from rlkube_operator.coordinator import get_status
from rlkube_operator.kube import ApiError, Kube
from rlkube_operator.render import (
    render,
    render_credential_secret,
    render_eval_statefulset,
    render_train_statefulset,
)
from rlkube_operator.settings import OperatorSettings
from rlkube_operator.status import (
    Children,
    CoordinatorReport,
    Phase,
    RoleObservation,
    derive_status,
    invalid_spec_status,
    parse_time,
    read_status,
    status_changed,
    status_patch,
)


class EventReason(StrEnum):
    """Reasons of the events the operator posts besides condition transitions (status.Reason)."""

    APPLIED = "Applied"
    SCALED = "Scaled"
    SCALED_DOWN = "ScaledDown"
    TTL_EXPIRED = "TTLExpired"
    INVALID_SPEC = "InvalidSpec"
    RECONCILE_ERROR = "ReconcileError"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    """What the handler publishes: a status merge patch (if anything changed) and events."""

    status_patch: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    phase: Phase | None = None
    deleted: bool = False


class ReconcileError(Exception):
    """An API call failed; ``retryable`` says whether trying again later can help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A kopf Body (or any mapping of mappings) as plain dicts and lists."""
    if isinstance(body, Mapping):
        return {str(k): _plain(v) for k, v in body.items()}
    if isinstance(body, list | tuple):
        return [_plain(v) for v in body]  # type: ignore[return-value]
    return body  # type: ignore[return-value]


def _generation(body: Mapping[str, Any]) -> int:
    return int(body.get("metadata", {}).get("generation") or 0)


@dataclass
class Reconciler:
    kube: Kube
    settings: OperatorSettings
    #: GetStatus; replaceable in tests.
    ask_coordinator: Callable[..., CoordinatorReport | None] = get_status

    # Parsing ---------------------------------------------------------------------------------

    def _parse(self, body: Mapping[str, Any], *, now: datetime) -> tuple[RLJob | None, Outcome | None]:
        raw = _plain(body)
        try:
            return parse_job(raw, source=f"RLJob {raw.get('metadata', {}).get('name', '?')}"), None
        except SpecError as exc:
            derived = invalid_spec_status(
                raw.get("status"), exc.problems, generation=_generation(raw), now=now
            )
            outcome = Outcome(phase=Phase.FAILED)
            if status_changed(raw.get("status"), derived.status):
                outcome.status_patch = status_patch(raw.get("status"), derived.status)
                outcome.events.append(Event("Warning", EventReason.INVALID_SPEC, "; ".join(exc.problems)))
            return None, outcome

    def _stopped(self, job: RLJob) -> bool:
        """Whether both StatefulSets should be at zero: suspended, or finished and cleaned."""
        phase = read_status(job.status).phase
        clean = job.spec.run_policy.clean_pod_policy is not CleanPodPolicy.NONE
        return job.spec.run_policy.suspend or (phase.is_terminal() and clean)

    def _apply(self, obj: dict[str, Any]) -> None:
        try:
            self.kube.apply(obj)
        except ApiError as exc:
            what = f"{obj['kind']} {obj['metadata']['name']}"
            raise ReconcileError(f"applying {what} failed: {exc}", retryable=exc.retryable) from exc
        metrics.APPLIES.labels(kind=obj["kind"]).inc()

    def _credential(self, job: RLJob, *, create: bool = True) -> str:
        """The job's token: read from its Secret, or generated once and applied as that Secret.

        ``create=False`` (status refreshes) only reads: '' when the Secret does not exist (yet).
        """
        try:
            secret = self.kube.get("v1", "Secret", job.namespace, c.secret_name(job.name))
        except ApiError as exc:
            raise ReconcileError(
                f"reading the job's credential failed: {exc}", retryable=exc.retryable
            ) from exc
        if secret is not None:
            encoded = (secret.get("data") or {}).get(c.TOKEN_KEY)
            if encoded:
                return base64.b64decode(encoded).decode().splitlines()[0].strip()
        if not create:
            return ""
        token = new_token()  # once per job: an existing Secret (maybe rotated by hand) is never replaced
        self._apply(render_credential_secret(job, self.settings.render, token=token))
        return token

    # Handlers' work --------------------------------------------------------------------------

    def reconcile(self, body: Mapping[str, Any], *, now: datetime) -> Outcome:
        """Apply every object of the job (idempotent: server-side apply of the rendered state)."""
        job, invalid = self._parse(body, now=now)
        if job is None:
            return invalid or Outcome()
        stopped = self._stopped(job)
        self._credential(job)  # before the pods that mount it
        objects = render(job, self.settings.render, stopped=stopped)
        for obj in objects:
            self._apply(obj)
        kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objects)
        why = " (scaled to zero: suspended)" if job.spec.run_policy.suspend else ""
        why = why or (" (scaled to zero: finished)" if stopped else "")
        return Outcome(events=[Event("Normal", EventReason.APPLIED, f"applied {kinds}{why}")])

    def scale(self, body: Mapping[str, Any], *, now: datetime) -> Outcome:
        """``spec.evaluator.replicas`` changed: apply the eval StatefulSet and nothing else."""
        job, invalid = self._parse(body, now=now)
        if job is None:
            return invalid or Outcome()
        if self._stopped(job):
            return Outcome()
        self._apply(render_eval_statefulset(job, self.settings.render))
        replicas = job.spec.evaluator.replicas
        return Outcome(events=[Event("Normal", EventReason.SCALED, f"eval replicas set to {replicas}")])

    def observe(self, job: RLJob) -> Children:
        ns = job.namespace
        try:
            train = self.kube.get("apps/v1", "StatefulSet", ns, c.train_statefulset_name(job.name))
            evals = self.kube.get("apps/v1", "StatefulSet", ns, c.eval_statefulset_name(job.name))
            selector = f"{c.LABEL_JOB}={job.name},{c.LABEL_ROLE}={Role.TRAIN.value}"
            pods = self.kube.list("v1", "Pod", ns, label_selector=selector)
        except ApiError as exc:
            raise ReconcileError(
                f"reading the job's children failed: {exc}", retryable=exc.retryable
            ) from exc
        restarts = {}
        for pod in pods:
            statuses = pod.get("status", {}).get("containerStatuses") or []
            count = sum(int(s.get("restartCount", 0)) for s in statuses)
            restarts[pod["metadata"]["uid"]] = PodRestarts(_pod_rank(pod["metadata"]), count)
        return Children(train=_role(train), eval=_role(evals), train_pod_restarts=restarts)

    def refresh(self, body: Mapping[str, Any], *, now: datetime) -> Outcome:
        """Observe children and the coordinator, derive the status, act on what it says."""
        job, invalid = self._parse(body, now=now)
        if job is None:
            return invalid or Outcome()
        previous = read_status(job.status)
        children = self.observe(job)
        report = None
        if children.train.exists and not self._stopped(job):
            target = self.settings.coordinator_target(job.name, job.namespace)
            report = self.ask_coordinator(
                target, timeout=self.settings.coordinator_timeout, token=self._credential(job, create=False)
            )
            if report is None and children.train.ready > 0:
                metrics.UNREACHABLE.inc()
        derived = derive_status(job, children, report, now=now)
        outcome = Outcome(phase=derived.phase)
        if status_changed(job.status, derived.status):
            outcome.status_patch = status_patch(job.status, derived.status)
        for transition in derived.transitions:
            kind = "Warning" if transition.warning else "Normal"
            outcome.events.append(Event(kind, transition.reason, transition.message))

        clean = job.spec.run_policy.clean_pod_policy is not CleanPodPolicy.NONE
        if derived.phase.is_terminal() and not previous.phase.is_terminal() and clean:
            self._apply(render_train_statefulset(job, self.settings.render, stopped=True))
            self._apply(render_eval_statefulset(job, self.settings.render, stopped=True))
            policy = job.spec.run_policy.clean_pod_policy.value
            outcome.events.append(
                Event("Normal", EventReason.SCALED_DOWN, f"cleanPodPolicy {policy}: scaled to zero")
            )
        ttl = job.spec.run_policy.ttl_seconds_after_finished
        finished_at = parse_time(derived.status.get("completionTime"))
        expired = run_policy.is_due(finished_at, ttl, now)
        if derived.phase.is_terminal() and expired:
            outcome.events.append(
                Event("Normal", EventReason.TTL_EXPIRED, f"deleting: finished more than {ttl}s ago")
            )
            try:
                self.kube.delete(job.api_version, job.kind, job.namespace, job.name)
            except ApiError as exc:
                raise ReconcileError(f"TTL deletion failed: {exc}", retryable=exc.retryable) from exc
            outcome.deleted = True
        return outcome


def _pod_rank(metadata: Mapping[str, Any]) -> int:
    """A StatefulSet pod's ordinal: its pod-index label, else the suffix of its name."""
    label = (metadata.get("labels") or {}).get(c.LABEL_POD_INDEX)
    text = label if label is not None else str(metadata.get("name", "")).rpartition("-")[2]
    return int(text) if text.isdigit() else 0


def _role(sts: Mapping[str, Any] | None) -> RoleObservation:
    if sts is None:
        return RoleObservation()
    status = sts.get("status") or {}
    return RoleObservation(
        exists=True,
        desired=int(sts.get("spec", {}).get("replicas") or 0),
        current=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
    )

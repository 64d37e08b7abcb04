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
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from rlkube import contract as c
from rlkube import run_policy
from rlkube.contract import Role, parse_termination_message
from rlkube.run_policy import PodRestarts
from rlkube.security.credential import new_token
from rlkube.spec import CleanPodPolicy, RLJob, SpecError, parse_job

from rlkube_operator import metrics
from rlkube_operator.compare import changed_fields, drift
from rlkube_operator.coordinator import get_status
from rlkube_operator.kube import ApiError, Kube
from rlkube_operator.kueue_gate import KueueGate
from rlkube_operator.kueue_workload import (
    Admission,
    QueueState,
    overlay_status,
    place,
    queue_message,
    uses_workload,
    within_admission,
)
from rlkube_operator.refusal_events import RefusalReason, refusal_events
from rlkube_operator.render import (
    ANNOTATION_SPEC_HASH,
    render,
    render_credential_secret,
    render_eval_statefulset,
    render_train_statefulset,
    spec_hash,
)
from rlkube_operator.settings import OperatorSettings
from rlkube_operator.status import (
    Children,
    CoordinatorReport,
    Phase,
    PodFailure,
    RoleObservation,
    derive_status,
    invalid_spec_status,
    parse_time,
    previous_status,
    spec_change_status,
    status_changed,
    status_patch,
)

#: Spec fields whose change never touches the train pods (``kubectl scale`` writes the first).
NOT_RESTARTING = ("spec.evaluator.replicas",)


class EventReason(StrEnum):
    """Reasons of the events the operator posts besides condition transitions (status.Reason)."""

    APPLIED = "Applied"
    SCALED = "Scaled"
    SCALED_DOWN = "ScaledDown"
    TTL_EXPIRED = "TTLExpired"
    INVALID_SPEC = "InvalidSpec"
    RECONCILE_ERROR = "ReconcileError"
    #: A child was deleted or edited by someone else and is put back as rendered.
    RESTORED = "Restored"
    #: A spec change replaces the train pods: the event names the fields.
    TRAINING_RESTARTS = "TrainingRestarts"
    #: The coordinator refused or quarantined fragments, or evicted an eval pod (``refusal_events``).
    FRAGMENTS_REFUSED = RefusalReason.FRAGMENTS_REFUSED.value
    EVAL_POD_EVICTED = RefusalReason.EVAL_POD_EVICTED.value
    #: The operator wrote to the job's Kueue Workload (finished, or its quota released).
    KUEUE_WORKLOAD = "KueueWorkload"


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


def job_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _current(pod: Mapping[str, Any], digest: str) -> bool:
    """Whether a pod runs the job's current spec (pods without the annotation count as current)."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return annotations.get(ANNOTATION_SPEC_HASH, digest) == digest


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conditions)


def pod_failures(pod: Mapping[str, Any]) -> list[PodFailure]:
    """What the pod's containers said when they stopped (``state`` and ``lastState`` terminated).

    A structured termination message (rlkube.contract.TerminationMessage) gives the reason; any
    other non-zero exit (the kubelet's log fallback, OOMKilled) is a failure a restart may fix.
    A container stopped by SIGTERM without a word is no failure (a scale-down, a rolling update).
    """
    name = pod.get("metadata", {}).get("name", "?")
    out: list[PodFailure] = []
    for container in pod.get("status", {}).get("containerStatuses") or []:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated")
            if not terminated:
                continue
            code = int(terminated.get("exitCode") or 0)
            text = terminated.get("message") or ""
            finished = terminated.get("finishedAt")
            parsed = parse_termination_message(text)
            if parsed is not None:
                out.append(PodFailure(name, parsed.reason, parsed.message, parsed.permanent, code, finished))
            elif terminated.get("reason") == "OOMKilled" or (code not in (0, 143) and code != 0):
                kubelet_reason = terminated.get("reason") or "Error"
                message = text.strip()[-1024:] or f"exit code {code} ({kubelet_reason})"
                out.append(PodFailure(name, kubelet_reason, message, False, code, finished))
    return out


@dataclass
class Reconciler:
    kube: Kube
    settings: OperatorSettings
    #: GetStatus; replaceable in tests.
    ask_coordinator: Callable[..., CoordinatorReport | None] = get_status
    #: The wall clock a refresh stamps its observation with; replaceable in tests.
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: Jobs (``ns/name``) whose pods a status refresh scaled to zero on finishing, before the
    #: status saying so is stored: a child watch then restores them at zero, not as running.
    finished: set[str] = field(default_factory=set)
    #: Kueue's decisions for jobs with ``kueueIntegration: RLJob`` (see "Kueue" below).
    kueue: KueueGate | None = None

    def __post_init__(self) -> None:
        if self.kueue is None:
            self.kueue = KueueGate(self.kube, self.settings.render)

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
        generation = _generation({"metadata": job.metadata.model_extra or {}})
        phase = previous_status(job.status, generation=generation).phase
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

    def reconcile(
        self, body: Mapping[str, Any], *, now: datetime, old: Mapping[str, Any] | None = None
    ) -> Outcome:
        """Apply every object of the job (idempotent: server-side apply of the rendered state).

        ``old`` is the job before this change (an update): when the change replaces the train
        pods, an event and the ``Restarting`` condition (reason ``SpecChanged``) name its fields.
        """
        job, invalid = self._parse(body, now=now)
        if job is None:
            return invalid or Outcome()
        admission = self._admission(job)
        stopped = self._stopped(job) or _held(admission)
        self._credential(job)  # before the pods that mount it
        if not stopped:
            self.finished.discard(job_key(job.namespace, job.name))
        outcome = Outcome()
        if old is not None and not stopped:
            outcome = self._announce_restart(job, old, now=now)
        objects = self._render(job, stopped=stopped, admission=admission)
        for obj in objects:
            self._apply(obj)
        kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objects)
        why = " (scaled to zero: suspended)" if job.spec.run_policy.suspend else ""
        if not why and admission is not None and _held(admission):
            why = f" (scaled to zero: {queue_message(admission)})"
        why = why or (" (scaled to zero: finished)" if stopped else "")
        outcome.events.insert(0, Event("Normal", EventReason.APPLIED, f"applied {kinds}{why}"))
        return outcome

    def _announce_restart(self, job: RLJob, old: Mapping[str, Any], *, now: datetime) -> Outcome:
        """If the change replaces running train pods: the Restarting/SpecChanged status and an event."""
        # kopf's ``old`` is an essence (spec, labels, annotations): the rest is the job's own.
        current = job.model_dump(mode="json", by_alias=True, exclude_none=True)
        try:
            before = parse_job({**current, "spec": _plain(old).get("spec", {})}, source="the previous RLJob")
        except SpecError:
            return Outcome()
        generation = _generation({"metadata": job.metadata.model_extra or {}})
        if previous_status(job.status, generation=generation).phase.is_terminal():
            return Outcome()
        old_template = render_train_statefulset(before, self.settings.render)["spec"]["template"]
        new_template = render_train_statefulset(job, self.settings.render)["spec"]["template"]
        if old_template == new_template:
            return Outcome()
        train = self.kube.get("apps/v1", "StatefulSet", job.namespace, c.train_statefulset_name(job.name))
        if train is None or not int(train.get("spec", {}).get("replicas") or 0):
            return Outcome()  # nothing runs yet: nothing restarts
        old_spec = before.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        new_spec = job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        fields = [f for f in changed_fields(old_spec, new_spec, prefix="spec") if f not in NOT_RESTARTING]
        fields = fields or ["the operator's settings"]
        derived = spec_change_status(job.status, fields, generation=generation, now=now)
        outcome = Outcome(phase=derived.phase)
        if status_changed(job.status, derived.status):
            outcome.status_patch = status_patch(job.status, derived.status)
        message = derived.status["message"]
        outcome.events.append(Event("Warning", EventReason.TRAINING_RESTARTS, message))
        return outcome

    def restore(
        self, body: Mapping[str, Any], kind: str, name: str, live: Mapping[str, Any] | None, *, now: datetime
    ) -> Outcome:
        """A child of the job changed or went: apply its rendering again if it drifted or is gone."""
        raw = _plain(body)
        if raw.get("metadata", {}).get("deletionTimestamp"):
            return Outcome()
        try:
            job = parse_job(raw, source=f"RLJob {raw.get('metadata', {}).get('name', '?')}")
        except SpecError:
            return Outcome()  # nothing is rendered for a job the operator refuses
        admission = self._admission(job)
        stopped = self._stopped(job) or job_key(job.namespace, job.name) in self.finished or _held(admission)
        rendered = next(
            (
                o
                for o in self._render(job, stopped=stopped, admission=admission)
                if (o["kind"], o["metadata"]["name"]) == (kind, name)
            ),
            None,
        )
        if rendered is None:
            return Outcome()
        if live is None:
            why = "was deleted"
        else:
            paths = drift(rendered, live)
            if not paths:
                return Outcome()
            shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            why = f"drifted from its rendering ({shown})"
        self._apply(rendered)
        return Outcome(events=[Event("Normal", EventReason.RESTORED, f"{kind} {name} {why}: restored")])

    def scale(self, body: Mapping[str, Any], *, now: datetime) -> Outcome:
        """``spec.evaluator.replicas`` changed: apply the eval StatefulSet and nothing else."""
        job, invalid = self._parse(body, now=now)
        if job is None:
            return invalid or Outcome()
        admission = self._admission(job)  # while queued, this resizes the Workload's eval PodSet
        if self._stopped(job) or _held(admission):
            return Outcome()
        self._apply(self._placed(render_eval_statefulset(job, self.settings.render), admission))
        replicas = job.spec.evaluator.replicas
        return Outcome(events=[Event("Normal", EventReason.SCALED, f"eval replicas set to {replicas}")])

    def observe(self, job: RLJob) -> Children:
        ns = job.namespace
        try:
            train = self.kube.get("apps/v1", "StatefulSet", ns, c.train_statefulset_name(job.name))
            evals = self.kube.get("apps/v1", "StatefulSet", ns, c.eval_statefulset_name(job.name))
            selector = f"{c.LABEL_JOB}={job.name},{c.LABEL_ROLE}={Role.TRAIN.value}"
            pods = self.kube.list("v1", "Pod", ns, label_selector=selector)
            eval_selector = f"{c.LABEL_JOB}={job.name},{c.LABEL_ROLE}={Role.EVAL.value}"
            eval_pods = self.kube.list("v1", "Pod", ns, label_selector=eval_selector)
        except ApiError as exc:
            raise ReconcileError(
                f"reading the job's children failed: {exc}", retryable=exc.retryable
            ) from exc
        digest = spec_hash(job, self.settings.render)
        restarts = {}
        current_ready = 0
        for pod in pods:
            if not _current(pod, digest):
                continue  # a pod of the previous spec, on its way out
            statuses = pod.get("status", {}).get("containerStatuses") or []
            count = sum(int(s.get("restartCount", 0)) for s in statuses)
            restarts[pod["metadata"]["uid"]] = PodRestarts(_pod_rank(pod["metadata"]), count)
            current_ready += _ready(pod)
        eval_restarts = {}
        for pod in eval_pods:
            if not _current(pod, digest):
                continue
            statuses = pod.get("status", {}).get("containerStatuses") or []
            count = sum(int(s.get("restartCount", 0)) for s in statuses)
            eval_restarts[pod["metadata"]["uid"]] = PodRestarts(_pod_rank(pod["metadata"]), count)
        failures: dict[tuple[str, str | None], PodFailure] = {}
        for pod in [*pods, *eval_pods]:
            if _current(pod, digest):
                for failure in pod_failures(pod):
                    failures[(failure.pod, failure.finished_at)] = failure
        return Children(
            train=_role(train),
            eval=_role(evals),
            train_pod_restarts=restarts,
            eval_pod_restarts=eval_restarts,
            failures=tuple(failures.values()),
            train_current_ready=current_ready if pods else None,
        )

    def refresh(self, body: Mapping[str, Any], *, now: datetime | None = None) -> Outcome:
        """Observe children and the coordinator, derive the status, act on what it says.

        ``now`` is the moment of observation; by default the clock is read after the coordinator
        answered, so a completionTime never predates the report it records (asking takes time,
        and a TTL counted from a stamp taken before asking would run out early).
        """
        job, invalid = self._parse(body, now=now or self.clock())
        if job is None:
            return invalid or Outcome()
        previous = previous_status(job.status, generation=_generation(_plain(body)))
        ttl = job.spec.run_policy.ttl_seconds_after_finished
        if previous.phase.is_terminal() and run_policy.is_due(
            parse_time(previous.completion_time), ttl, now or self.clock()
        ):
            # Finished before and its TTL ran out: delete now, without observing what is about
            # to go (the children follow by garbage collection), so the deletion is on time.
            outcome = Outcome(phase=previous.phase)
            self._delete_expired(job, ttl, outcome)
            return outcome
        admission = self._admission(job)
        children = self.observe(job)
        report = None
        if children.train.exists and not self._stopped(job) and not _held(admission):
            target = self.settings.coordinator_target(job.name, job.namespace)
            report = self.ask_coordinator(
                target, timeout=self.settings.coordinator_timeout, token=self._credential(job, create=False)
            )
            if report is None and children.train.ready > 0:
                metrics.UNREACHABLE.inc()
        now = now or self.clock()
        waiting = admission is not None and admission.state in (QueueState.QUEUED, QueueState.PREEMPTED)
        derived = derive_status(_as_suspended(job) if waiting else job, children, report, now=now)
        status = derived.status
        if admission is not None and not job.spec.run_policy.suspend:
            status = overlay_status(status, admission)
        outcome = Outcome(phase=derived.phase)
        if status_changed(job.status, status):
            outcome.status_patch = status_patch(job.status, status)
        for transition in derived.transitions:
            kind = "Warning" if transition.warning else "Normal"
            reason, message = transition.reason, transition.message
            if admission is not None and not job.spec.run_policy.suspend and reason in _SUSPENSION_REASONS:
                reason, message = admission.state.value, queue_message(admission)
                kind = "Warning" if admission.state is QueueState.PREEMPTED else "Normal"
            outcome.events.append(Event(kind, reason, message))
        if admission is not None:
            self._follow_kueue(job, admission, children, derived.phase, outcome, now=now)
        for reason, message in refusal_events(job.status, derived.status):
            outcome.events.append(Event("Warning", reason, message))

        clean = job.spec.run_policy.clean_pod_policy is not CleanPodPolicy.NONE
        if derived.phase.is_terminal() and not previous.phase.is_terminal() and clean:
            self.finished.add(job_key(job.namespace, job.name))
            self._apply(render_train_statefulset(job, self.settings.render, stopped=True))
            self._apply(render_eval_statefulset(job, self.settings.render, stopped=True))
            policy = job.spec.run_policy.clean_pod_policy.value
            outcome.events.append(
                Event("Normal", EventReason.SCALED_DOWN, f"cleanPodPolicy {policy}: scaled to zero")
            )
        finished_at = parse_time(derived.status.get("completionTime"))
        if derived.phase.is_terminal() and run_policy.is_due(finished_at, ttl, now):
            self._delete_expired(job, ttl, outcome)
        return outcome

    # Kueue (spec.scheduling.kueueIntegration RLJob: rlkube_operator.kueue_workload) ---------------

    def _admission(self, job: RLJob) -> Admission | None:
        """Kueue's decision about a job on the RLJob integration (its Workload made first); None
        for every other job."""
        if not uses_workload(job) or self.kueue is None:
            return None
        try:
            return self.kueue.admission(job)
        except ApiError as exc:
            raise ReconcileError(
                f"reading the job's Kueue Workload failed: {exc}", retryable=exc.retryable
            ) from exc

    def _placed(self, obj: dict[str, Any], admission: Admission | None) -> dict[str, Any]:
        return self._render_placed([obj], admission)[0]

    def _render(self, job: RLJob, *, stopped: bool, admission: Admission | None) -> list[dict[str, Any]]:
        return self._render_placed(render(job, self.settings.render, stopped=stopped), admission)

    def _render_placed(
        self, objects: list[dict[str, Any]], admission: Admission | None
    ) -> list[dict[str, Any]]:
        """The admitted flavours' node labels and tolerations on the pods (as Kueue's integrations do)."""
        if admission is None or not admission.runs or self.kueue is None:
            return objects
        try:
            return within_admission(place(objects, self.kueue.placements(admission)), admission)
        except ApiError as exc:
            raise ReconcileError(
                f"reading Kueue's ResourceFlavors failed: {exc}", retryable=exc.retryable
            ) from exc

    def _follow_kueue(
        self,
        job: RLJob,
        admission: Admission,
        children: Children,
        phase: Phase,
        outcome: Outcome,
        *,
        now: datetime,
    ) -> None:
        """Make the pods follow Kueue's decision, and tell Kueue what the job did.

        Admitted while scaled to zero: start (apply everything). Queued or evicted while pods run:
        scale to zero, which gives every pod SIGTERM and its grace period (train rank 0 saves a
        checkpoint then). Evicted and every pod gone: release the quota, so Kueue requeues the job
        and its preemptor is admitted. Finished: mark the Workload Finished (the quota is freed).
        """
        assert self.kueue is not None
        terminal = phase.is_terminal()
        try:
            if terminal:
                self.kueue.drop_eval_slice(job)
                done = self.kueue.settle(
                    job, pods_left=-1, outcome=(phase is Phase.COMPLETE, phase.value), now=now
                )
            else:
                wanted = 0 if _held(admission) else job.spec.trainer.replicas
                if (
                    children.train.exists
                    and children.train.desired != wanted
                    and not job.spec.run_policy.suspend
                ):
                    stopped = _held(admission)
                    for obj in self._render(job, stopped=stopped, admission=admission):
                        self._apply(obj)
                    what = "scaled to zero" if stopped else "started"
                    outcome.events.append(
                        Event("Normal", EventReason.APPLIED, f"{what}: {queue_message(admission)}")
                    )
                elif admission.runs and children.eval.exists:
                    self._follow_eval_slice(job, admission, children, outcome, now=now)
                pods = 0
                if admission.state is QueueState.PREEMPTED and admission.has_reservation:
                    pods = len(
                        self.kube.list("v1", "Pod", job.namespace, label_selector=f"{c.LABEL_JOB}={job.name}")
                    )
                done = self.kueue.settle(job, pods_left=pods, outcome=None, now=now)
        except ApiError as exc:
            raise ReconcileError(
                f"updating the job's Kueue Workload failed: {exc}", retryable=exc.retryable
            ) from exc
        if done:
            outcome.events.append(Event("Normal", EventReason.KUEUE_WORKLOAD, done))

    def _follow_eval_slice(
        self, job: RLJob, admission: Admission, children: Children, outcome: Outcome, *, now: datetime
    ) -> None:
        """An admitted job's eval side follows its eval slice: grown when Kueue admits the slice,
        shrunk when it evicts it (the quota released once the extra eval pods are gone)."""
        assert self.kueue is not None
        wanted = within_admission([render_eval_statefulset(job, self.settings.render)], admission)[0]
        replicas = int(wanted["spec"]["replicas"])
        if children.eval.desired != replicas:
            self._apply(self._placed(render_eval_statefulset(job, self.settings.render), admission))
            outcome.events.append(
                Event(
                    "Normal",
                    EventReason.SCALED,
                    f"eval replicas set to {replicas} of {job.spec.evaluator.replicas}: "
                    "as many as Kueue admitted",
                )
            )
        extension = admission.eval_slice
        if extension is not None and extension.state is QueueState.PREEMPTED:
            base = replicas  # the slice no longer counts: what the job's own Workload admitted
            selector = f"{c.LABEL_JOB}={job.name},{c.LABEL_ROLE}={Role.EVAL.value}"
            pods = len(self.kube.list("v1", "Pod", job.namespace, label_selector=selector))
            done = self.kueue.release_eval_slice(job, eval_pods=pods, base_eval=base, now=now)
            if done:
                outcome.events.append(Event("Normal", EventReason.KUEUE_WORKLOAD, done))

    def _delete_expired(self, job: RLJob, ttl: int | None, outcome: Outcome) -> None:
        """Delete a finished job whose ``ttlSecondsAfterFinished`` ran out (recorded in ``outcome``)."""
        outcome.events.append(
            Event("Normal", EventReason.TTL_EXPIRED, f"deleting: finished more than {ttl}s ago")
        )
        try:
            self.kube.delete(job.api_version, job.kind, job.namespace, job.name)
        except ApiError as exc:
            raise ReconcileError(f"TTL deletion failed: {exc}", retryable=exc.retryable) from exc
        outcome.deleted = True


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


#: Suspended-condition transitions a Kueue decision explains better (rlkube_operator.kueue_workload).
_SUSPENSION_REASONS = frozenset({"JobSuspended", "JobResumed"})


def _held(admission: Admission | None) -> bool:
    """Whether Kueue holds the job at zero (queued, evicted, or its Workload finished)."""
    return admission is not None and not admission.runs


def _as_suspended(job: RLJob) -> RLJob:
    """The job as if ``runPolicy.suspend`` were true: what its status says while Kueue holds it."""
    policy = job.spec.run_policy.model_copy(update={"suspend": True})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"run_policy": policy})})

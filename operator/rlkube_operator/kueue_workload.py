"""An RLJob as one Kueue Workload (``spec.scheduling.kueueIntegration: RLJob``): pure.

The operator is Kueue's integration for RLJobs (Kueue's external-framework route, as AppWrapper's
controller is): it creates the Workload, Kueue queues and admits it, and the operator runs the job
only while it is admitted. This module holds the decisions, no I/O:

* :func:`render_workload`: the Workload (``kueue.x-k8s.io/v1beta2``) of a job: PodSet ``train``
  (every rank; Kueue admits a PodSet whole, so the ranks are one gang) and PodSet ``eval`` (the
  eval workers), each with the pod template the StatefulSet gets, so Kueue counts the containers'
  requests; the priority of ``trainer.priorityClassName``; owned by the RLJob (garbage collection
  removes it with the job); ``spec.active`` false while ``runPolicy.suspend`` is true.
* :func:`read_admission`: what the Workload says (queued, admitted with which flavours, evicted
  with which reason, finished) as one frozen :class:`Admission`.
* :func:`place`: the admitted flavours' node labels and tolerations on the StatefulSets' pods,
  what Kueue's own integrations inject into a job's pod templates when they start it;
  :func:`within_admission`: no more eval pods than Kueue admitted.
* :func:`finished_status` and :func:`released_status`: the Workload status patches the
  integration writes: Finished when the job ends (Kueue frees its quota), and, after an eviction
  once every pod is gone, QuotaReserved=False without admission (Kueue requeues it), as Kueue's
  jobframework reconciler does for its own jobs.
* :func:`overlay_status`: the job's ``Suspended`` condition and phase message say Queued,
  Admitted or Preempted with Kueue's reason and message.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlkube import contract as c
from rlkube.contract import Role
from rlkube.spec import GangScheduler, KueueIntegration, RLJob

from rlkube_operator.render import LABEL_MANAGED_BY, MANAGED_BY, owner_references, render_pod_template
from rlkube_operator.settings import RenderSettings

WORKLOAD_API = "kueue.x-k8s.io/v1beta2"
#: The PodSet of each role (Kueue PodSet names are DNS labels).
POD_SETS: dict[Role, str] = {Role.TRAIN: "train", Role.EVAL: "eval"}
#: Kueue's Workload condition types (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
#: Eviction reasons after which Kueue requeues the workload (``Requeued`` True).
REQUEUE_REASONS = frozenset({"Preempted", "NodeFailures"})


class QueueState(StrEnum):
    """Where the job stands with Kueue; the reason of its ``Suspended`` condition."""

    QUEUED = "Queued"  # no Workload yet, or waiting for quota
    ADMITTED = "Admitted"
    PREEMPTED = "Preempted"  # evicted (by preemption or otherwise): checkpoint, release, requeue
    FINISHED = "Finished"


@dataclass(frozen=True)
class Admission:
    state: QueueState
    #: Kueue's own reason and message (QuotaReserved's while queued, Evicted's after an eviction).
    reason: str = ""
    message: str = ""
    cluster_queue: str = ""
    #: PodSet name -> the ResourceFlavors it was admitted on.
    flavors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: PodSet name -> the pods admitted (the PodSet's count when Kueue does not say).
    counts: Mapping[str, int] = field(default_factory=dict)
    #: Whether the Workload holds quota (an evicted one does until the integration releases it).
    has_reservation: bool = False
    #: The job's eval slice (eval replicas beyond those of the admitted Workload), if it has one.
    eval_slice: Admission | None = None

    @property
    def runs(self) -> bool:
        return self.state is QueueState.ADMITTED


@dataclass(frozen=True)
class Placement:
    """What an admitted flavour adds to a pod (ResourceFlavor ``nodeLabels`` and ``tolerations``)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def uses_workload(job: RLJob) -> bool:
    scheduling = job.spec.scheduling
    return scheduling.gang is GangScheduler.KUEUE and scheduling.kueue_integration is KueueIntegration.RLJOB


def workload_name(job: RLJob) -> str:
    """``rljob-<name>``: one Workload per job (a job recreated under the same name gets a new one
    only after garbage collection removed the old one's; its owner reference tells them apart)."""
    return f"rljob-{job.name}"[:253]


def render_workload(job: RLJob, settings: RenderSettings, *, priority: int | None) -> dict[str, Any]:
    """The job's Workload; ``priority`` is the value of ``trainer.priorityClassName`` (None: unset)."""
    pod_sets = []
    for role, count in ((Role.TRAIN, job.spec.trainer.replicas), (Role.EVAL, job.spec.evaluator.replicas)):
        template = render_pod_template(job, role, settings)
        pod_sets.append({"name": POD_SETS[role], "count": count, "template": template})
    spec: dict[str, Any] = {
        "queueName": str(job.spec.scheduling.queue),
        "podSets": pod_sets,
        "active": not job.spec.run_policy.suspend,
    }
    priority_class = job.spec.trainer.priority_class_name
    if priority_class and priority is not None:
        spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": priority_class,
        }
        spec["priority"] = priority
    metadata: dict[str, Any] = {
        "name": workload_name(job),
        "namespace": job.namespace,
        "labels": {c.LABEL_JOB: job.name, LABEL_MANAGED_BY: MANAGED_BY},
    }
    owners = owner_references(job)
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": WORKLOAD_API, "kind": "Workload", "metadata": metadata, "spec": spec}


#: The label that marks a job's eval slice (its value: the PodSet it extends).
LABEL_SLICE = "rlkube.io/kueue-slice"


def eval_slice_name(job: RLJob) -> str:
    """``rljob-<name>-eval``: the Workload of the eval replicas a scale added to an admitted job."""
    return f"rljob-{job.name}-eval"[:253]


def render_eval_slice(
    job: RLJob, settings: RenderSettings, *, count: int, priority: int | None
) -> dict[str, Any]:
    """A Workload of ``count`` more eval pods, queued on its own: an admitted Workload's PodSets
    cannot change, so a scale-up beyond them waits as a slice of its own, and a preemption that
    takes it shrinks the eval side instead of stopping the job."""
    workload = render_workload(job, settings, priority=priority)
    workload["metadata"]["name"] = eval_slice_name(job)
    workload["metadata"]["labels"][LABEL_SLICE] = POD_SETS[Role.EVAL]
    eval_set = next(p for p in workload["spec"]["podSets"] if p["name"] == POD_SETS[Role.EVAL])
    workload["spec"]["podSets"] = [{**eval_set, "count": count}]
    return workload


def pod_set_count(workload: Mapping[str, Any], name: str) -> int:
    """The declared count of PodSet ``name`` (0 when the Workload has none)."""
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        if pod_set.get("name") == name:
            return int(pod_set.get("count", 0))
    return 0


def owned_by(workload: Mapping[str, Any], job: RLJob) -> bool:
    """Whether ``workload`` belongs to this incarnation of the job (its owner reference's uid)."""
    uid = (job.metadata.model_extra or {}).get("uid")
    owners = workload.get("metadata", {}).get("ownerReferences") or []
    return not uid or any(o.get("uid") == uid for o in owners)


def _conditions(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(x.get("type")): x for x in (workload.get("status") or {}).get("conditions") or []}


def _true(condition: Mapping[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def read_admission(workload: Mapping[str, Any] | None) -> Admission:
    """What the Workload says. None (not created yet) is queued."""
    if workload is None:
        return Admission(QueueState.QUEUED, "Pending", "the Workload is being created")
    conditions = _conditions(workload)
    admission = (workload.get("status") or {}).get("admission") or None
    reserved = _true(conditions.get(QUOTA_RESERVED)) and admission is not None
    if _true(conditions.get(FINISHED)):
        finished = conditions[FINISHED]
        return Admission(
            QueueState.FINISHED, str(finished.get("reason", "")), str(finished.get("message", ""))
        )
    evicted = conditions.get(EVICTED)
    if _true(evicted) and evicted is not None:
        return Admission(
            QueueState.PREEMPTED,
            str(evicted.get("reason", "")),
            str(evicted.get("message", "")),
            has_reservation=reserved,
        )
    if reserved and _true(conditions.get(ADMITTED)):
        assert admission is not None
        flavors = {
            str(a.get("name")): tuple(sorted(set((a.get("flavors") or {}).values())))
            for a in admission.get("podSetAssignments") or []
        }
        declared = {
            str(p.get("name")): int(p.get("count", 0))
            for p in (workload.get("spec") or {}).get("podSets") or []
        }
        counts = {
            str(a.get("name")): int(a.get("count", declared.get(str(a.get("name")), 0)))
            for a in admission.get("podSetAssignments") or []
        }
        admitted = conditions[ADMITTED]
        return Admission(
            QueueState.ADMITTED,
            str(admitted.get("reason", "Admitted")),
            str(admitted.get("message", "")),
            cluster_queue=str(admission.get("clusterQueue", "")),
            flavors=flavors,
            counts=counts,
            has_reservation=True,
        )
    quota = conditions.get(QUOTA_RESERVED)
    if quota is not None:
        return Admission(
            QueueState.QUEUED,
            str(quota.get("reason", "Pending")),
            str(quota.get("message", "")),
            has_reservation=reserved,
        )
    return Admission(QueueState.QUEUED, "Pending", "waiting for Kueue to consider the Workload")


def placement(flavors: tuple[str, ...], resource_flavors: Mapping[str, Mapping[str, Any]]) -> Placement:
    """The node labels and tolerations of the flavours a PodSet was admitted on (Kueue's
    podset.FromAssignment): labels merged in order, tolerations concatenated."""
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for name in flavors:
        spec = (resource_flavors.get(name) or {}).get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations.extend(t for t in spec.get("tolerations") or [] if t not in tolerations)
    return Placement(selector, tuple(tolerations))


def place(objects: list[dict[str, Any]], placements: Mapping[Role, Placement]) -> list[dict[str, Any]]:
    """``objects`` with each role's StatefulSet pod template carrying its placement (a copy)."""
    out = []
    for obj in objects:
        role = (obj.get("metadata", {}).get("labels") or {}).get(c.LABEL_ROLE)
        found = placements.get(Role(role)) if obj.get("kind") == "StatefulSet" and role else None
        if found is None or (not found.node_selector and not found.tolerations):
            out.append(obj)
            continue
        placed = copy.deepcopy(obj)
        pod = placed["spec"]["template"]["spec"]
        if found.node_selector:
            pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **found.node_selector}
        if found.tolerations:
            tolerations = list(pod.get("tolerations") or [])
            tolerations += [dict(t) for t in found.tolerations if dict(t) not in tolerations]
            pod["tolerations"] = tolerations
        out.append(placed)
    return out


def within_admission(objects: list[dict[str, Any]], admission: Admission) -> list[dict[str, Any]]:
    """``objects`` with the eval StatefulSet at most as large as the eval pods Kueue admitted: a
    ``kubectl scale`` beyond it waits (the Workload's PodSets cannot change while it holds quota)."""
    admitted = admission.counts.get(POD_SETS[Role.EVAL])
    out = []
    for obj in objects:
        role = (obj.get("metadata", {}).get("labels") or {}).get(c.LABEL_ROLE)
        eval_set = obj.get("kind") == "StatefulSet" and role == Role.EVAL.value
        if admitted is not None and eval_set and int(obj["spec"].get("replicas") or 0) > admitted:
            obj = {**obj, "spec": {**obj["spec"], "replicas": admitted}}
        out.append(obj)
    return out


def _condition(
    kind: str, status: bool, reason: str, message: str, *, stamp: str, generation: int
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": stamp,
        "observedGeneration": generation,
    }


def _with(conditions: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """``conditions`` with ``new`` in place of its type (keeping the transition time when unflipped)."""
    out = []
    replaced = False
    for old in conditions:
        if old.get("type") == new["type"]:
            replaced = True
            if old.get("status") == new["status"]:
                new = {**new, "lastTransitionTime": old.get("lastTransitionTime", new["lastTransitionTime"])}
            out.append(new)
        else:
            out.append(dict(old))
    return out if replaced else [*out, new]


def finished_status(
    workload: Mapping[str, Any], *, succeeded: bool, message: str, stamp: str
) -> dict[str, Any]:
    """The status patch that marks the Workload Finished (Kueue then frees its quota)."""
    generation = int(workload.get("metadata", {}).get("generation") or 0)
    reason = "Succeeded" if succeeded else "Failed"
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    finished = _condition(FINISHED, True, reason, message, stamp=stamp, generation=generation)
    return {"conditions": _with(conditions, finished)}


def released_status(workload: Mapping[str, Any], *, stamp: str) -> dict[str, Any]:
    """After an eviction, once the job's pods are gone: no admission, QuotaReserved and Admitted
    False, Requeued (True after a preemption): Kueue's ``UnsetQuotaReservationWithCondition``."""
    generation = int(workload.get("metadata", {}).get("generation") or 0)
    conditions = [dict(x) for x in (workload.get("status") or {}).get("conditions") or []]
    evicted = _conditions(workload).get(EVICTED) or {}
    reason, message = str(evicted.get("reason", "Evicted")), str(evicted.get("message", ""))
    for new in (
        _condition(REQUEUED, reason in REQUEUE_REASONS, reason, message, stamp=stamp, generation=generation),
        _condition(QUOTA_RESERVED, False, "Pending", message, stamp=stamp, generation=generation),
        _condition(
            ADMITTED,
            False,
            "NoReservation",
            "The workload has no reservation",
            stamp=stamp,
            generation=generation,
        ),
    ):
        conditions = _with(conditions, new)
    return {"admission": None, "conditions": conditions}


def queue_message(admission: Admission) -> str:
    """What the job's status says about Kueue (its condition message and phase message)."""
    if admission.state is QueueState.ADMITTED:
        where = f" (ClusterQueue {admission.cluster_queue})" if admission.cluster_queue else ""
        return f"admitted by Kueue{where}"
    if admission.state is QueueState.PREEMPTED:
        return f"evicted by Kueue ({admission.reason}): {admission.message}; checkpointed and requeued"
    if admission.state is QueueState.FINISHED:
        return "the Workload is finished"
    detail = f": {admission.message}" if admission.message else ""
    return f"queued by Kueue ({admission.reason}){detail}"


def overlay_status(status: dict[str, Any], admission: Admission) -> dict[str, Any]:
    """The derived status with its ``Suspended`` condition (and the message of a Suspended phase)
    saying what Kueue decided. Only while the user has not suspended the job themselves."""
    if admission.state is QueueState.FINISHED:
        return status
    out = dict(status)
    message = queue_message(admission)
    conditions = []
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Suspended" and (
            condition.get("status") == "True" or admission.state is QueueState.ADMITTED
        ):
            condition = {**condition, "reason": admission.state.value, "message": message}
        conditions.append(condition)
    out["conditions"] = conditions
    if out.get("phase") == "Suspended":
        out["message"] = message
    return out

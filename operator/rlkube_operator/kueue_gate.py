"""The operator as Kueue's integration for RLJobs: the API calls around :mod:`.kueue_workload` (I/O).

:class:`KueueGate` is what :class:`~rlkube_operator.reconcile.Reconciler` asks about a job whose
``spec.scheduling.kueueIntegration`` is ``RLJob``:

* :meth:`KueueGate.admission` creates the job's Workload when it is missing (and keeps its
  ``spec.active`` equal to ``not runPolicy.suspend``; its PodSets follow the spec while Kueue holds
  no quota for it), and returns what Kueue decided;
* :meth:`KueueGate.placements` reads the admitted ResourceFlavors' node labels and tolerations;
* :meth:`KueueGate.settle` writes what Kueue waits for from an integration: Finished when the job
  ended, and the quota released once an evicted job's pods are all gone (after their grace period,
  in which train rank 0 saved a checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from rlkube.contract import Role
from rlkube.spec import RLJob

from rlkube_operator.kube import ApiError, Kube
from rlkube_operator.kueue_workload import (
    POD_SETS,
    WORKLOAD_API,
    Admission,
    Placement,
    QueueState,
    eval_slice_name,
    finished_status,
    owned_by,
    placement,
    pod_set_count,
    read_admission,
    released_status,
    render_eval_slice,
    render_workload,
    workload_name,
)
from rlkube_operator.settings import RenderSettings

KUEUE_API = "kueue.x-k8s.io/v1beta2"


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class KueueGate:
    kube: Kube
    settings: RenderSettings

    def workload(self, job: RLJob) -> dict[str, Any] | None:
        found = self.kube.get(WORKLOAD_API, "Workload", job.namespace, workload_name(job))
        return found if found is not None and owned_by(found, job) else None

    def admission(self, job: RLJob) -> Admission:
        """Kueue's decision about the job, creating or updating its Workload first as needed."""
        current = self.kube.get(WORKLOAD_API, "Workload", job.namespace, workload_name(job))
        if current is not None and not owned_by(current, job):
            # An earlier job of the same name: garbage collection removes it; wait for that.
            return read_admission(None)
        if current is None:
            current = self.kube.apply(render_workload(job, self.settings, priority=self._priority(job)))
        else:
            spec = current.get("spec") or {}
            counts = [(POD_SETS[Role.TRAIN], job.spec.trainer.replicas)]
            counts.append((POD_SETS[Role.EVAL], job.spec.evaluator.replicas))
            # PodSets are immutable only while quota is held (a scale then makes an eval slice).
            resize = not read_admission(current).has_reservation and _counts(spec) != counts
            if resize or spec.get("active", True) is job.spec.run_policy.suspend:
                wanted = render_workload(job, self.settings, priority=self._priority(job))
                # Server-side apply drops what it owned and leaves out: send every field, the
                # PodSets as stored unless resized.
                pod_sets = wanted["spec"]["podSets"] if resize else spec.get("podSets")
                current = self.kube.apply({**wanted, "spec": {**wanted["spec"], "podSets": pod_sets}})
        base = read_admission(current)
        if not base.runs:
            self.drop_eval_slice(job)  # queued, evicted or finished: one Workload holds the whole job
            return base
        return self._with_eval_slice(job, base, current)

    def _with_eval_slice(self, job: RLJob, base: Admission, current: Mapping[str, Any]) -> Admission:
        """An admitted job's eval replicas beyond its Workload's eval PodSet, as a slice of their own."""
        eval_set = POD_SETS[Role.EVAL]
        base_eval = pod_set_count(current, eval_set)
        extra = job.spec.evaluator.replicas - base_eval
        found = self._eval_slice(job)
        if extra <= 0:
            self.drop_eval_slice(job)
            return base
        if found is not None and pod_set_count(found, eval_set) != extra:
            if read_admission(found).has_reservation:
                # Resized while it holds quota (immutable then): a slice of the new size queues anew.
                self.kube.delete(WORKLOAD_API, "Workload", job.namespace, eval_slice_name(job))
                found = None
            else:
                found = self.kube.apply(
                    render_eval_slice(job, self.settings, count=extra, priority=self._priority(job))
                )
        if found is None:
            found = self.kube.apply(
                render_eval_slice(job, self.settings, count=extra, priority=self._priority(job))
            )
        extension = read_admission(found)
        admitted = base.counts.get(eval_set, base_eval) + (extra if extension.runs else 0)
        return replace(base, counts={**base.counts, eval_set: admitted}, eval_slice=extension)

    def _eval_slice(self, job: RLJob) -> dict[str, Any] | None:
        found = self.kube.get(WORKLOAD_API, "Workload", job.namespace, eval_slice_name(job))
        return found if found is not None and owned_by(found, job) else None

    def drop_eval_slice(self, job: RLJob) -> None:
        """Delete the job's eval slice, if any (Kueue frees what it held)."""
        if self._eval_slice(job) is not None:
            self.kube.delete(WORKLOAD_API, "Workload", job.namespace, eval_slice_name(job))

    def release_eval_slice(self, job: RLJob, *, eval_pods: int, base_eval: int, now: datetime) -> str | None:
        """An evicted eval slice's quota, released once the eval pods are back to ``base_eval``."""
        found = self._eval_slice(job)
        if found is None or eval_pods > base_eval:
            return None
        extension = read_admission(found)
        if extension.state is not QueueState.PREEMPTED or not extension.has_reservation:
            return None
        try:
            self._patch_status(found, released_status(found, stamp=_stamp(now)))
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise
        return f"Workload {eval_slice_name(job)}: eval slice evicted ({extension.reason}), quota released"

    def _priority(self, job: RLJob) -> int | None:
        name = job.spec.trainer.priority_class_name
        if not name:
            return None
        found = self.kube.get("scheduling.k8s.io/v1", "PriorityClass", "", name)
        return int(found.get("value", 0)) if found is not None else None

    def placements(self, admission: Admission) -> dict[Role, Placement]:
        """Each role's placement from the flavours its PodSet was admitted on."""
        names = {n for flavors in admission.flavors.values() for n in flavors}
        flavors = {}
        for name in names:
            found = self.kube.get(KUEUE_API, "ResourceFlavor", "", name)
            if found is not None:
                flavors[name] = found
        return {
            role: placement(admission.flavors.get(pod_set, ()), flavors) for role, pod_set in POD_SETS.items()
        }

    def settle(
        self, job: RLJob, *, pods_left: int, outcome: tuple[bool, str] | None, now: datetime
    ) -> str | None:
        """Tell Kueue what the job did: ``outcome`` (succeeded, message) once it finished; after an
        eviction, the quota released when ``pods_left`` is 0. Returns what it wrote, if anything."""
        current = self.workload(job)
        if current is None:
            return None
        admission = read_admission(current)
        name = str(current["metadata"]["name"])
        try:
            if outcome is not None and admission.state is not QueueState.FINISHED:
                succeeded, message = outcome
                patch = finished_status(current, succeeded=succeeded, message=message, stamp=_stamp(now))
                self._patch_status(current, patch)
                return f"Workload {name} finished"
            if admission.state is QueueState.PREEMPTED and admission.has_reservation and pods_left == 0:
                self._patch_status(current, released_status(current, stamp=_stamp(now)))
                return f"Workload {name}: quota released after the eviction"
        except ApiError as exc:
            if exc.status == 409:
                return None  # Kueue wrote first: the next refresh reads its version
            raise
        return None

    def _patch_status(self, workload: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
        meta = workload["metadata"]
        self.kube.patch_status(
            WORKLOAD_API,
            "Workload",
            meta["namespace"],
            meta["name"],
            patch,
            resource_version=str(meta["resourceVersion"]),
        )


def _counts(spec: Mapping[str, Any]) -> list[tuple[str, int]]:
    return [(str(p.get("name")), int(p.get("count", 0))) for p in spec.get("podSets") or []]

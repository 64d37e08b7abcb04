"""The kopf handlers: thin glue between watch events and :class:`rlkube_operator.reconcile.Reconciler`.

I/O. Each handler reads the body, calls one reconciler method (which calls the pure render or
status functions), publishes the outcome (status patch, events, metrics) and maps failures to
kopf's retry semantics. No manifest literals here.

* create / resume  -> apply every object of the job
* update           -> a change of only ``spec.evaluator.replicas`` (``kubectl scale``) applies the
                      eval StatefulSet alone; any other spec change applies everything (and, when
                      it replaces the train pods, says which fields did it)
* RLJob events     -> the status refresher's copy of the job (:mod:`rlkube_operator.refresher`:
                      children + the coordinator's GetStatus -> status, events, run policy, on a
                      schedule of its own; no kopf timer, so no finalizer)
* pod events       -> the job's status is refreshed soon (restarts, termination messages)
* Workload events  -> (``kueueIntegration: RLJob``) the job is refreshed soon: Kueue admitted,
                      evicted or requeued it
* child events     -> a StatefulSet, Service or ConfigMap of a job that was deleted or drifted
                      from its rendering is applied again (level-triggered), with an event
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf
from rlkube import contract as c
from rlkube import spec as specmod

from rlkube_operator import metrics, startup
from rlkube_operator.reconcile import EventReason, Outcome, ReconcileError
from rlkube_operator.render import LABEL_MANAGED_BY, MANAGED_BY
from rlkube_operator.settings import load_settings

#: Read once, at import (``rlkube operator`` imports this module after checking the settings).
SETTINGS = load_settings()
RESOURCE = (specmod.API_GROUP, specmod.API_VERSION, specmod.PLURAL)
EVAL_REPLICAS = ("spec", "evaluator", "replicas")
#: The children the operator renders, watched so that a deleted or edited one is put back.
CHILDREN = (("apps", "v1", "statefulsets"), ("", "v1", "services"), ("", "v1", "configmaps"))
CHILD_KINDS = {"statefulsets": "StatefulSet", "services": "Service", "configmaps": "ConfigMap"}
OURS: dict[str, Any] = {LABEL_MANAGED_BY: MANAGED_BY, c.LABEL_JOB: kopf.PRESENT}

#: Seconds before kopf retries a reconcile that failed for a reason that may pass (409, 429, 5xx).
RETRY_DELAY = 5.0


@kopf.on.startup()
async def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    startup.configure(settings, SETTINGS)
    await startup.start(memo, SETTINGS, logger=logger)


@kopf.on.cleanup()
async def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await startup.stop(memo)


def _key(body: kopf.Body) -> str:
    return f"{body.metadata.namespace}/{body.metadata.name}"


def _publish(outcome: Outcome, *, body: kopf.Body, patch: kopf.Patch) -> None:
    if outcome.status_patch:
        patch["status"] = outcome.status_patch
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1024])
    if outcome.deleted:
        metrics.PHASES.forget(_key(body))
    elif outcome.phase is not None:
        metrics.PHASES.set(_key(body), outcome.phase)


def _run(handler: str, work: Any, *, body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
    with metrics.measured(handler):
        try:
            outcome = work(body, now=datetime.now(UTC), **kwargs)
        except ReconcileError as exc:
            kopf.event(
                body, type="Warning", reason=EventReason.RECONCILE_ERROR.value, message=str(exc)[:1024]
            )
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from exc
            raise kopf.PermanentError(str(exc)) from exc
        if any(event.reason == EventReason.INVALID_SPEC for event in outcome.events):
            metrics.ERRORS.labels(handler=handler).inc()  # a spec the schema let through, refused here
        _publish(outcome, body=body, patch=patch)


@kopf.on.create(*RESOURCE)
def on_create(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _run("create", memo.reconciler.reconcile, body=body, patch=patch)


@kopf.on.resume(*RESOURCE)
def on_resume(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _run("resume", memo.reconciler.reconcile, body=body, patch=patch)


def only_eval_replicas_changed(diff: kopf.Diff) -> bool:
    """True when every change in the diff is to ``spec.evaluator.replicas`` (what /scale writes)."""
    if not diff:
        return False
    for _op, field, old, new in diff:
        path = tuple(field)
        if path == EVAL_REPLICAS:
            continue
        if path == EVAL_REPLICAS[:2] and _only_replicas(old, new):
            continue
        return False
    return True


def _only_replicas(old: Any, new: Any) -> bool:
    before = {k: v for k, v in dict(old or {}).items() if k != "replicas"}
    after = {k: v for k, v in dict(new or {}).items() if k != "replicas"}
    return before == after


@kopf.on.update(*RESOURCE)
def on_update(
    body: kopf.Body,
    old: kopf.BodyEssence | Any | None,
    diff: kopf.Diff,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    if only_eval_replicas_changed(diff):
        _run("scale", memo.reconciler.scale, body=body, patch=patch)
    else:
        _run("update", memo.reconciler.reconcile, body=body, patch=patch, old=old)


@kopf.on.event(*RESOURCE)
async def on_job_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Every RLJob change, for the status refresher (which replaces a kopf timer: no finalizer).

    Async, so it runs on the loop the refresher runs on (a sync handler would run in a thread)."""
    memo.refresher.seen(str(event.get("type") or "ADDED"), body)


@kopf.on.event("", "v1", "pods", labels={c.LABEL_JOB: kopf.PRESENT})
async def on_pod_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A pod of a job changed (started, restarted, stopped with a message): refresh the job soon."""
    labels = body.metadata.labels or {}
    memo.refresher.poke(str(body.metadata.namespace), str(labels.get(c.LABEL_JOB)))


@kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", labels={c.LABEL_JOB: kopf.PRESENT})
async def on_workload_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Kueue admitted, evicted or requeued a job's Workload (kueueIntegration RLJob): refresh the job
    soon, which starts it or checkpoints and stops it (kopf skips this watch without Kueue's CRDs)."""
    labels = body.metadata.labels or {}
    memo.refresher.poke(str(body.metadata.namespace), str(labels.get(c.LABEL_JOB)))


def _on_child_event(
    event: kopf.RawEvent, body: kopf.Body, resource: kopf.Resource, memo: kopf.Memo, **_: Any
) -> None:
    """A child of a job was deleted or changed: put it back as rendered if it drifted."""
    labels = body.metadata.labels or {}
    namespace, job_name = str(body.metadata.namespace), str(labels.get(c.LABEL_JOB))
    job = memo.refresher.body(namespace, job_name)
    if job is None:
        return  # its job is gone (garbage collection follows) or not seen yet (resume applies it)
    owners = [o.get("uid") for o in body.metadata.get("ownerReferences") or []]
    if owners and job["metadata"].get("uid") not in owners:
        return  # a leftover of an earlier job of the same name
    live = None if event.get("type") == "DELETED" else dict(body)
    kind = CHILD_KINDS[resource.plural]
    with metrics.measured("restore"):
        try:
            outcome = memo.reconciler.restore(job, kind, str(body.metadata.name), live, now=datetime.now(UTC))
        except ReconcileError as exc:
            memo.kube.post_event(job, type="Warning", reason=EventReason.RECONCILE_ERROR, message=str(exc))
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from exc
            raise kopf.PermanentError(str(exc)) from exc
    for item in outcome.events:
        memo.kube.post_event(job, type=item.type, reason=item.reason, message=item.message)


for _child in CHILDREN:
    kopf.on.event(*_child, labels=OURS)(_on_child_event)


@kopf.on.delete(*RESOURCE, optional=True)
def on_delete(body: kopf.Body, **_: Any) -> None:
    """No finalizer (``optional``): the children go by owner-reference garbage collection."""
    metrics.PHASES.forget(_key(body))

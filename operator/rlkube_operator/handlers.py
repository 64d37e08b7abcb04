"""The kopf handlers: thin glue between watch events and :class:`rlkube_operator.reconcile.Reconciler`.

I/O. Each handler reads the body, calls one reconciler method (which calls the pure render or
status functions), publishes the outcome (status patch, events, metrics) and maps failures to
kopf's retry semantics. No manifest literals here.

* create / resume  -> apply every object of the job
* update           -> a change of only ``spec.evaluator.replicas`` (``kubectl scale``) applies the
                      eval StatefulSet alone; any other spec change applies everything
* timer            -> children + the coordinator's GetStatus -> status, events, run policy
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf
from rlkube import spec as specmod

from rlkube_operator import metrics, startup
from rlkube_operator.reconcile import EventReason, Outcome, ReconcileError
from rlkube_operator.settings import load_settings

#: Read once, at import (``rlkube operator`` imports this module after checking the settings).
SETTINGS = load_settings()
RESOURCE = (specmod.API_GROUP, specmod.API_VERSION, specmod.PLURAL)
EVAL_REPLICAS = ("spec", "evaluator", "replicas")

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


def _run(handler: str, work: Any, *, body: kopf.Body, patch: kopf.Patch) -> None:
    with metrics.measured(handler):
        try:
            outcome = work(body, now=datetime.now(UTC))
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
def on_update(body: kopf.Body, diff: kopf.Diff, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    if only_eval_replicas_changed(diff):
        _run("scale", memo.reconciler.scale, body=body, patch=patch)
    else:
        _run("update", memo.reconciler.reconcile, body=body, patch=patch)


@kopf.timer(*RESOURCE, interval=SETTINGS.status_interval)
def refresh_status(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _run("status", memo.reconciler.refresh, body=body, patch=patch)
    metrics.HEARTBEAT.beat()


@kopf.on.delete(*RESOURCE, optional=True)
def on_delete(body: kopf.Body, **_: Any) -> None:
    """No finalizer (``optional``): the children go by owner-reference garbage collection."""
    metrics.PHASES.forget(_key(body))

"""The status refresher: every job's status on a schedule of its own, without a kopf timer.

I/O (asyncio; the blocking reconciler runs in the default executor). kopf timers and daemons
put a finalizer on every object they serve, so ``kubectl delete rlj`` would hang whenever the
operator is down; and kopf notices a deleted object's timer only at its next poll, so a TTL
fired up to a minute late. This replaces the timer:

* the kopf watch handlers feed :meth:`Refresher.seen` with each RLJob body (the newest body is
  kept by resourceVersion) and :meth:`Refresher.poke` when a job's pods change;
* each job is refreshed every ``interval`` seconds, at once when it appears, soon after a pod of
  it changes, and exactly when its run policy next decides something by the clock
  (``status.next_decision``: the TTL running out, ``activeDeadlineSeconds`` passing), so those
  decisions come within a fraction of a second of their due time;
* the refresh itself is :meth:`Reconciler.refresh` (pure derivation plus the run policy's
  actions); its status patch and events are published here through :class:`Kube`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rlkube.spec import SpecError, parse_job

from rlkube_operator import metrics
from rlkube_operator.kube import ApiError, Kube
from rlkube_operator.reconcile import EventReason, Outcome, ReconcileError, Reconciler, _plain, job_key
from rlkube_operator.status import next_decision

logger = logging.getLogger(__name__)

#: Seconds after a pod event before its job is refreshed (pod events come in bursts).
POD_DEBOUNCE = 0.2
#: Seconds past a due time at which the refresh runs (the deadline check is strict: "longer than").
DUE_MARGIN = 0.05
#: Seconds before a refresh that failed is tried again.
RETRY_DELAY = 5.0


def _version(body: Mapping[str, Any]) -> int | None:
    try:
        return int(body.get("metadata", {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


@dataclass
class Refresher:
    reconciler: Reconciler
    kube: Kube
    #: Seconds between two refreshes of one job (RLKUBE_STATUS_INTERVAL).
    interval: float
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)  # job key -> time.monotonic()
    _running: set[str] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _last_error: dict[str, str] = field(default_factory=dict)
    #: When each job's last refresh began (wall clock): a decision due before it was taken then.
    _refreshed_at: dict[str, datetime] = field(default_factory=dict)

    # Feeding --------------------------------------------------------------------------------------

    def seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A watch event of an RLJob (or the answer to our own status patch)."""
        raw = _plain(body)
        meta = raw.get("metadata", {})
        key = job_key(meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.forget(key)
            return
        known = self.jobs.get(key)
        if known is not None and known.get("metadata", {}).get("uid") == meta.get("uid"):
            old, new = _version(known), _version(raw)
            if old is not None and new is not None and new < old:
                return  # an event older than what we already hold (our own patch's answer)
        self.jobs[key] = raw
        generation_changed = known is None or known.get("metadata", {}).get("generation") != meta.get(
            "generation"
        )
        self._schedule(key, soon=generation_changed)

    def forget(self, key: str) -> None:
        self.jobs.pop(key, None)
        self.due.pop(key, None)
        self._last_error.pop(key, None)
        self._refreshed_at.pop(key, None)
        self.reconciler.finished.discard(key)

    def poke(self, namespace: str, name: str, *, delay: float = POD_DEBOUNCE) -> None:
        """Refresh this job soon (one of its pods changed)."""
        key = job_key(namespace, name)
        if key in self.jobs:
            self._at(key, time.monotonic() + delay)

    def body(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.jobs.get(job_key(namespace, name))

    def _at(self, key: str, when: float) -> None:
        if when < self.due.get(key, float("inf")):
            self.due[key] = when
            self._wake.set()

    def _schedule(self, key: str, *, soon: bool = False, after: float | None = None) -> None:
        """The next refresh: ``after`` seconds (default: the interval), earlier if a decision is due."""
        now = time.monotonic()
        when = now + (self.interval if after is None else after)
        if soon:
            when = now
        decision = self._decision_delay(key)
        if decision is not None:
            when = min(when, now + decision)
        if after is not None or soon or key not in self.due:
            self.due[key] = when
        else:
            self.due[key] = min(self.due[key], when)
        self._wake.set()

    def _decision_delay(self, key: str) -> float | None:
        body = self.jobs.get(key)
        if body is None:
            return None
        try:
            job = parse_job(body)
        except SpecError:
            return None
        due = next_decision(job)
        last = self._refreshed_at.get(key)
        if due is None or (last is not None and due < last):
            return None  # nothing due, or it was due at the last refresh (which acted on it)
        return max(0.0, (due - datetime.now(UTC)).total_seconds() + DUE_MARGIN)

    # Running --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Refresh what is due, forever (cancel to stop)."""
        while True:
            now = time.monotonic()
            for key, when in list(self.due.items()):
                if when <= now and key not in self._running and key in self.jobs:
                    self._running.add(key)
                    del self.due[key]
                    asyncio.get_running_loop().create_task(self._refresh(key))
            metrics.HEARTBEAT.beat()
            upcoming = [w for k, w in self.due.items() if k not in self._running]
            timeout = min([self.interval, *(w - now for w in upcoming)])
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.01, timeout))
            except TimeoutError:
                pass

    async def _refresh(self, key: str) -> None:
        retry: float | None = None
        try:
            body = self.jobs.get(key)
            if body is None:
                return
            self._refreshed_at[key] = datetime.now(UTC)
            loop = asyncio.get_running_loop()
            stored, gone = await loop.run_in_executor(None, self._refresh_blocking, key, body)
            if gone:
                self.forget(key)
            elif stored:
                self.seen("MODIFIED", stored)
        except Exception as exc:  # the loop must outlive any one job's trouble
            retry = RETRY_DELAY
            logger.warning("refreshing %s failed: %s", key, exc)
        finally:
            self._running.discard(key)
            if key in self.jobs:
                self._schedule(key, after=retry)

    def _refresh_blocking(self, key: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        """Refresh and publish (in a worker thread); the stored body, and whether the job is gone."""
        with metrics.measured("status"):
            try:
                outcome = self.reconciler.refresh(body)
            except ReconcileError as exc:
                self._error(key, body, str(exc))
                raise
        return self._publish(key, body, outcome)

    def _error(self, key: str, body: dict[str, Any], message: str) -> None:
        if self._last_error.get(key) == message:
            return  # said once is enough
        self._last_error[key] = message
        self._event(body, "Warning", EventReason.RECONCILE_ERROR, message)

    def _publish(
        self, key: str, body: dict[str, Any], outcome: Outcome
    ) -> tuple[dict[str, Any] | None, bool]:
        self._last_error.pop(key, None)
        meta = body["metadata"]
        stored = None
        if outcome.status_patch and not outcome.deleted:
            try:
                stored = self.kube.patch_status(
                    body["apiVersion"], body["kind"], meta["namespace"], meta["name"], outcome.status_patch
                )
            except ApiError as exc:
                if exc.status == 404:
                    return None, True
                raise
        for event in outcome.events:
            self._event(body, event.type, event.reason, event.message)
        if outcome.deleted:
            metrics.PHASES.forget(key)
            return None, True
        if outcome.phase is not None:
            metrics.PHASES.set(key, outcome.phase)
        return stored, False

    def _event(self, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            self.kube.post_event(body, type=kind, reason=str(reason), message=message)
        except ApiError as exc:
            logger.warning(
                "event %s about %s not posted: %s", reason, body.get("metadata", {}).get("name"), exc
            )

"""Leader election through a coordination.k8s.io Lease (I/O; decisions in :mod:`.leadership`).

:meth:`LeaseElector.acquire` returns once this replica holds the Lease; the operator starts
watching only then (kopf starts its watchers after the startup handlers, which wait here).
:meth:`LeaseElector.keep` renews it and raises :class:`LeadershipLost` when another replica
holds it or no renewal succeeded for the renew deadline; the operator then exits at once, and
its restarted container is a standby. :meth:`LeaseElector.release` hands it over on a clean stop.

Every write names the resourceVersion read before it (a PUT) or creates (a POST), so of two
replicas that decide at the same moment one gets 409 and stays a standby.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from rlkube_operator.kube import ApiError, Kube
from rlkube_operator.leadership import (
    LeaseRecord,
    Observation,
    Step,
    claimed,
    decide,
    observe,
    released,
    renew_deadline,
    retry_period,
)

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"

log = logging.getLogger(__name__)

#: Reads and writes a clean stop makes to leave the Lease (a conflict is tried again).
RELEASE_TRIES = 5


class LeadershipLost(Exception):
    """This replica no longer holds the Lease; it must stop acting now."""


def micro_time(moment: datetime | None = None) -> str:
    """A Kubernetes MicroTime: RFC 3339 UTC with microseconds."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, kube: Kube, *, namespace: str, name: str, identity: str, duration_s: int) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration_s = duration_s
        self.retry_s = retry_period(duration_s)
        self.deadline_s = renew_deadline(duration_s)
        self._seen: Observation | None = None
        self._leading = False

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def try_once(self) -> bool:
        """Read the Lease and create, take or renew it if this replica may; True when it holds it."""
        now = time.monotonic()
        lease = self.kube.get(API_VERSION, KIND, self.namespace, self.name)
        current = None if lease is None else LeaseRecord.from_spec(lease.get("spec"))
        self._seen = None if current is None else observe(self._seen, current, now)
        step = decide(self._seen, self.identity, now)
        if step is Step.WAIT:
            self._leading = False
            return False
        record = claimed(current, self.identity, duration_s=self.duration_s, now=micro_time())
        try:
            if lease is None:  # Step.CREATE
                self.kube.create(self._object(record, resource_version=None))
            else:
                self.kube.replace(self._object(record, resource_version=lease["metadata"]["resourceVersion"]))
        except ApiError as exc:
            if exc.status == 409:  # another replica wrote first
                self._leading = False
                return False
            raise
        if step is Step.TAKE and current is not None and current.holder:
            log.warning(f"took {self.where} from {current.holder}, which stopped renewing it")
        self._leading = True
        return True

    async def acquire(self) -> None:
        """Return once this replica holds the Lease; errors of the API are logged and retried."""
        waiting_logged = False
        while True:
            try:
                if await asyncio.to_thread(self.try_once):
                    return
            except ApiError as exc:
                log.warning(f"could not read or write {self.where} ({exc}); retrying")
            if not waiting_logged and self._seen is not None:
                log.info(f"standing by: {self.where} is held by {self._seen.record.holder}")
                waiting_logged = True
            await asyncio.sleep(self.retry_s)

    async def keep(self) -> None:
        """Renew every retry period; raise :class:`LeadershipLost` when it is no longer ours."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_s)
            try:
                held = await asyncio.to_thread(self.try_once)
            except Exception as exc:  # the API server away: keep trying until the deadline
                held = None
                reason = f"no renewal for {self.deadline_s:.1f} s (last error: {exc})"
            if held:
                renewed = time.monotonic()
                continue
            if held is False:
                holder = self._seen.record.holder if self._seen is not None else "nobody"
                raise LeadershipLost(f"{self.where} is held by {holder}")
            if time.monotonic() - renewed >= self.deadline_s:
                raise LeadershipLost(f"{self.where}: {reason}")

    def release(self) -> None:
        """Leave the Lease without a holder so that a standby takes it at its next try."""
        if not self._leading:
            return
        self._leading = False
        for attempt in range(RELEASE_TRIES):
            try:
                lease = self.kube.get(API_VERSION, KIND, self.namespace, self.name)
                if lease is None:
                    return
                current = LeaseRecord.from_spec(lease.get("spec"))
                if current.holder != self.identity:
                    return
                record = released(current, now=micro_time())
                self.kube.replace(self._object(record, resource_version=lease["metadata"]["resourceVersion"]))
                log.info(f"released {self.where}")
                return
            except ApiError as exc:
                # A renewal still in flight when the renewing task was cancelled wrote the Lease
                # between our read and our write (409): read it again. Otherwise the standby takes
                # over when the duration runs out instead.
                if exc.status != 409 or attempt == RELEASE_TRIES - 1:
                    log.warning(f"could not release {self.where} ({exc})")
                    return

    def _object(self, record: LeaseRecord, *, resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": record.as_spec()}

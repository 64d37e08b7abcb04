"""Leader election through a coordination.k8s.io Lease: the decisions, free of I/O.

The replicas of the operator share one Lease in the operator's namespace. A replica acts only
while it holds it; the I/O around these decisions is :mod:`rlkube_operator.lease_election`.

Expiry is judged on the local monotonic clock, never on the times written in the Lease (the
replicas' clocks may disagree): a standby remembers when it first saw the Lease's record as it is
now, and takes it once the record has not changed for ``leaseDurationSeconds``. The leader
renews every retry period and gives up (its process exits) when it has not renewed for the renew
deadline, which is shorter than the duration, so a leader that cannot renew stops before a
standby can take over. This is client-go's leaderelection model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease's spec that decide who leads."""

    holder: str  # "" when released
    duration_s: int
    acquire_time: str  # RFC 3339 with microseconds, as the API stores it; "" when never held
    renew_time: str
    transitions: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaseRecord:
        spec = spec or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def as_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": self.acquire_time or None,
            "renewTime": self.renew_time or None,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class Observation:
    """A record and the local monotonic time it was first seen unchanged."""

    record: LeaseRecord
    seen_at: float


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The observation after reading ``record`` at ``now``: its clock restarts when the record changed."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


class Step(enum.Enum):
    CREATE = "create"  # no Lease yet
    TAKE = "take"  # released, or its holder stopped renewing
    RENEW = "renew"  # ours
    WAIT = "wait"  # another replica holds it


def decide(seen: Observation | None, me: str, now: float) -> Step:
    """What replica ``me`` does with the Lease it has just read (``None``: there is none)."""
    if seen is None:
        return Step.CREATE
    record = seen.record
    if record.holder == me:
        return Step.RENEW
    if not record.holder or now >= seen.seen_at + record.duration_s:
        return Step.TAKE
    return Step.WAIT


def claimed(current: LeaseRecord | None, me: str, *, duration_s: int, now: str) -> LeaseRecord:
    """The record ``me`` writes to create, take or renew the Lease at wall time ``now`` (RFC 3339)."""
    if current is not None and current.holder == me:
        return replace(current, duration_s=duration_s, renew_time=now)
    transitions = 0 if current is None else current.transitions + 1
    return LeaseRecord(
        holder=me, duration_s=duration_s, acquire_time=now, renew_time=now, transitions=transitions
    )


def released(current: LeaseRecord, *, now: str) -> LeaseRecord:
    """The record a leader leaves when it stops: no holder, so a standby takes it at its next try."""
    return replace(current, holder="", duration_s=1, renew_time=now)


def renew_deadline(duration_s: int) -> float:
    """Seconds a leader keeps acting without a successful renewal: two thirds of the duration
    (client-go's 10 s of 15), so it stops before a standby may take the Lease."""
    return duration_s * 2 / 3


def retry_period(duration_s: int) -> float:
    """Seconds between tries to take or renew (client-go's 2 s of 15), at least 0.5 s."""
    return max(0.5, duration_s * 2 / 15)

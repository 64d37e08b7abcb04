"""Who the eval workers are: registration, heartbeats and expiry (what they loaded: weights.consistency).

Pure state machine: every method takes ``now`` (monotonic seconds) and does no I/O; the gRPC
servicer holds the lock. A worker is identified by the id the coordinator gives it; a pod that
registers again (a restarted pod keeps its name) replaces its previous incarnation at once, so
work leased to a dead process is reassigned without waiting for its lease to expire.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Worker:
    worker_id: str
    pod_name: str
    node_name: str
    replica_index: int
    num_envs: int
    registered_at: float
    last_seen: float
    fragments_pushed: int = 0
    env_steps: int = 0
    #: The public name (``pod#n``), for logs and status; ``worker_id`` adds a secret part.
    name: str = ""


@dataclass(frozen=True)
class Departure:
    """A worker that left: by deregistering, by expiring, or replaced by a new registration."""

    worker_id: str
    pod_name: str
    reason: str


@dataclass
class Membership:
    """Registered eval workers. ``lease_seconds``: heartbeat at least this often or be expired."""

    lease_seconds: float = 15.0
    _workers: dict[str, Worker] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def register(
        self, *, pod_name: str, node_name: str, replica_index: int, num_envs: int, now: float
    ) -> tuple[Worker, list[Departure]]:
        """Add a worker; an older registration of the same pod is removed and returned."""
        replaced = [
            Departure(w.worker_id, w.pod_name, "re-registered")
            for w in self._workers.values()
            if pod_name and w.pod_name == pod_name
        ]
        for gone in replaced:
            del self._workers[gone.worker_id]
        name = f"{pod_name or 'worker'}#{next(self._ids)}"
        # The id a worker presents on every call: unguessable, so no one else can act as it.
        worker_id = f"{name}.{secrets.token_urlsafe(12)}"
        worker = Worker(
            name=name,
            worker_id=worker_id,
            pod_name=pod_name,
            node_name=node_name,
            replica_index=replica_index,
            num_envs=num_envs,
            registered_at=now,
            last_seen=now,
        )
        self._workers[worker_id] = worker
        return worker, replaced

    def touch(self, worker_id: str, *, now: float) -> Worker | None:
        """Record a sign of life; None when the worker is unknown (expired or never registered)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return None
        worker.last_seen = now
        return worker

    def deregister(self, worker_id: str, *, reason: str) -> Departure | None:
        worker = self._workers.pop(worker_id, None)
        return (
            None if worker is None else Departure(worker.worker_id, worker.pod_name, reason or "deregistered")
        )

    def expire(self, *, now: float) -> list[Departure]:
        """Remove workers silent for longer than ``lease_seconds``."""
        expired = [w for w in self._workers.values() if now - w.last_seen > self.lease_seconds]
        for worker in expired:
            del self._workers[worker.worker_id]
        return [Departure(w.worker_id, w.pod_name, "lease expired") for w in expired]

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def workers(self) -> list[Worker]:
        return sorted(self._workers.values(), key=lambda w: (w.node_name, w.replica_index, w.worker_id))

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._workers

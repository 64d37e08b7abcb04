"""Run-policy decisions, pure: what counts against ``backoffLimit``, when a deadline or a TTL is due.

One implementation for both control planes: the operator's ``status.py`` (a cluster) and the local
supervisor of ``rlkube run`` (processes) call these functions, so a job fails after the same
number of crashes, and at the same moment, wherever it runs.

**Backoff.** A crash of any train rank takes the whole train group down (the other ranks'
collectives fail, every rank restarts and resumes from the newest checkpoint), so the unit that
counts is a *restart of the train group*, not of one container: the group has restarted as often
as its most-restarted rank. A 4-rank job with ``backoffLimit: 5`` survives five crashes and fails
at the sixth, on a cluster (where one crash shows as one restart on each of the 4 pods) and under
``rlkube run`` (which restarts the group itself) alike. Kubeflow's training operator sums
container restarts over pods instead, which makes the limit depend on the replica count.

**Eval backoff.** An eval worker restarts alone (the others and training go on), so
``evalBackoffLimit`` is checked per replica: the most-restarted replica, across its replaced pods.

**Deadline.** ``activeDeadlineSeconds`` runs from the job's (last) start; it is due the moment the
time has passed, and :func:`due_in` says how long until then so a caller can wake up on time.

**TTL.** ``ttlSecondsAfterFinished`` runs from completion; it applies on a cluster (the RLJob is
deleted); a local run has nothing to delete, it just ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class PodRestarts:
    """One train pod as observed now: its rank and the restart count of its containers."""

    rank: int
    count: int


@dataclass(frozen=True)
class RestartLedger:
    """Train restarts so far: per rank, across every pod that has held that rank.

    ``last_seen`` is the count last observed per pod uid, so a pod that the StatefulSet controller
    replaces (new uid, count from zero) adds to its rank's total instead of resetting it.
    """

    per_rank: Mapping[int, int] = field(default_factory=dict)
    last_seen: Mapping[str, int] = field(default_factory=dict)

    @property
    def group_restarts(self) -> int:
        """Restarts of the train group: what ``backoffLimit`` is checked against."""
        return max(self.per_rank.values(), default=0)

    def observe(self, pods: Mapping[str, PodRestarts]) -> RestartLedger:
        """The ledger after observing ``pods`` (uid -> rank and restart count)."""
        per_rank = dict(self.per_rank)
        for uid, pod in pods.items():
            increment = max(0, pod.count - self.last_seen.get(uid, 0))
            if increment:
                per_rank[pod.rank] = per_rank.get(pod.rank, 0) + increment
        return RestartLedger(per_rank, {uid: pod.count for uid, pod in pods.items()})

    def group_restarted(self, ranks: int) -> RestartLedger:
        """The ledger after a supervisor restarted the whole group of ``ranks`` ranks itself."""
        per_rank = {rank: self.per_rank.get(rank, 0) + 1 for rank in range(ranks)}
        return RestartLedger(per_rank, self.last_seen)


def backoff_exceeded(group_restarts: int, backoff_limit: int) -> bool:
    """Whether the job has failed: it restarted more often than ``backoffLimit`` allows."""
    return group_restarts > backoff_limit


def backoff_message(group_restarts: int, backoff_limit: int) -> str:
    return (
        f"the train group restarted {group_restarts} times, more than runPolicy.backoffLimit {backoff_limit}"
    )


def eval_backoff_message(pod: str, restarts: int, eval_backoff_limit: int) -> str:
    """An eval replica restarts on its own (a crash does not take the others down): each counts alone."""
    return (
        f"eval worker {pod} restarted {restarts} times, more than runPolicy.evalBackoffLimit "
        f"{eval_backoff_limit}"
    )


def due_at(since: datetime | None, seconds: int | None) -> datetime | None:
    """When a period of ``seconds`` that began at ``since`` ends (None: no such period)."""
    if since is None or seconds is None:
        return None
    return since + timedelta(seconds=seconds)


def is_due(since: datetime | None, seconds: int | None, now: datetime) -> bool:
    """Whether the period has run out at ``now`` (a deadline counts from start, a TTL from finish)."""
    end = due_at(since, seconds)
    return end is not None and now >= end


def due_in(since: datetime | None, seconds: int | None, now: datetime) -> float | None:
    """Seconds from ``now`` until the period runs out (0 when it has); None when there is none."""
    end = due_at(since, seconds)
    if end is None:
        return None
    return max(0.0, (end - now).total_seconds())


def deadline_message(active_deadline_seconds: int) -> str:
    return f"ran longer than runPolicy.activeDeadlineSeconds {active_deadline_seconds}"

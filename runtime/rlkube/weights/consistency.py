"""Coordinator-side checks of what eval policies loaded: fingerprints and a load tracker.

No I/O. The PolicyGroup coordinator feeds :class:`LoadTracker` from ``ReportLoaded`` calls
and from the versions the trainer publishes; RLightning's two PolicyGroup operations map to it:

* ``wait_for_eval_weight_update(timeout)``: block until every tracked eval worker reports the
  newest published version (or a newer incarnation's), or the timeout passes;
* ``verify_eval_weight_consistency(rtol)``: compare each worker's per-parameter norms with the
  trainer's: ``|train - eval| / max(|train|, 1e-8) > rtol`` is a mismatch; a parameter missing
  on either side is one too.

Times are passed in (``now``) or come from ``time.monotonic`` only where the tracker waits.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlkube.weight_key import WeightKey

Fingerprint = Mapping[str, float]


@dataclass(frozen=True)
class Mismatch:
    worker_id: str
    param: str
    train_norm: float | None  # None: the trainer has no such parameter
    eval_norm: float | None  # None: the eval policy has no such parameter
    rel_error: float


@dataclass(frozen=True)
class ConsistencyReport:
    consistent: bool
    checked: tuple[str, ...]  # worker ids compared
    mismatches: tuple[Mismatch, ...] = ()

    def summary(self, limit: int = 5) -> str:
        if self.consistent:
            return f"{len(self.checked)} eval workers match the trainer"
        parts = [
            f"{m.worker_id}:{m.param} train={m.train_norm} eval={m.eval_norm} rel={m.rel_error:.3g}"
            for m in self.mismatches[:limit]
        ]
        more = len(self.mismatches) - limit
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def compare_fingerprints(
    train: Fingerprint, evaluated: Fingerprint, *, rtol: float = 1e-3, worker_id: str = ""
) -> list[Mismatch]:
    """Every parameter whose norms differ by more than ``rtol`` (relative to the trainer's)."""
    mismatches = []
    for name in sorted(set(train) | set(evaluated)):
        t, e = train.get(name), evaluated.get(name)
        if t is None or e is None:
            mismatches.append(Mismatch(worker_id, name, t, e, math.inf))
            continue
        rel = abs(t - e) / max(abs(t), 1e-8)
        if not rel <= rtol:  # also catches NaN
            mismatches.append(Mismatch(worker_id, name, t, e, rel))
    return mismatches


def verify_eval_weight_consistency(
    train: Fingerprint, evals: Mapping[str, Fingerprint], *, rtol: float = 1e-3
) -> ConsistencyReport:
    """Compare every eval worker's fingerprint with the trainer's (RLightning's check, over pods)."""
    mismatches = []
    for worker_id in sorted(evals):
        mismatches += compare_fingerprints(train, evals[worker_id], rtol=rtol, worker_id=worker_id)
    return ConsistencyReport(not mismatches, tuple(sorted(evals)), tuple(mismatches))


@dataclass
class WorkerLoad:
    worker_id: str
    node_name: str = ""
    incarnation: str = ""
    version: int = 0
    fingerprint: dict[str, float] = field(default_factory=dict)
    load_seconds: float = 0.0
    blocked_seconds: float = 0.0
    reported_at: float = 0.0


class LoadTracker:
    """Published versions and what each eval worker reports having loaded (thread-safe)."""

    def __init__(self, *, rtol: float = 1e-3) -> None:
        self.rtol = rtol
        self._cond = threading.Condition()
        self._published: WeightKey | None = None
        self._train_fingerprints: dict[WeightKey, dict[str, float]] = {}
        self._workers: dict[str, WorkerLoad] = {}

    # -- inputs
    def published(self, incarnation: str, version: int, fingerprint: Fingerprint | None = None) -> None:
        """The trainer committed ``version`` (with its fingerprint, if computed)."""
        with self._cond:
            self._published = WeightKey(incarnation, version)
            if fingerprint is not None:
                self._train_fingerprints[self._published] = dict(fingerprint)
                for old in sorted(self._train_fingerprints, key=lambda k: k.version)[:-8]:
                    del self._train_fingerprints[old]
            self._cond.notify_all()

    def register(self, worker_id: str, node_name: str = "") -> None:
        with self._cond:
            self._workers.setdefault(worker_id, WorkerLoad(worker_id, node_name))
            self._cond.notify_all()

    def forget(self, worker_id: str) -> None:
        """A worker left (deregistered or its lease expired): nobody waits for it any more."""
        with self._cond:
            self._workers.pop(worker_id, None)
            self._cond.notify_all()

    def report(self, load: WorkerLoad, *, now: float) -> tuple[bool, str]:
        """Record a ``ReportLoaded``; returns (consistent, detail) against the trainer's fingerprint."""
        load.reported_at = now
        with self._cond:
            self._workers[load.worker_id] = load
            train = self._train_fingerprints.get(WeightKey(load.incarnation, load.version))
            self._cond.notify_all()
        if train is None or not load.fingerprint:
            return True, "no trainer fingerprint for this version to compare with"
        report = verify_eval_weight_consistency(train, {load.worker_id: load.fingerprint}, rtol=self.rtol)
        return report.consistent, report.summary()

    # -- queries
    def workers(self) -> list[WorkerLoad]:
        with self._cond:
            return list(self._workers.values())

    def lagging(self) -> list[str]:
        """Workers that have not loaded the newest published version."""
        with self._cond:
            return self._lagging()

    def _lagging(self) -> list[str]:
        if self._published is None:
            return []
        incarnation, version = self._published
        return sorted(
            w.worker_id for w in self._workers.values() if w.incarnation != incarnation or w.version < version
        )

    def node_versions(self) -> dict[str, tuple[int, int]]:
        """node -> (lowest version loaded there, workers): the per-node weight lag in status."""
        with self._cond:
            nodes: dict[str, list[int]] = {}
            for w in self._workers.values():
                nodes.setdefault(w.node_name, []).append(w.version)
            return {node: (min(vs), len(vs)) for node, vs in nodes.items()}

    def wait_for_eval_weight_update(self, timeout: float = 60.0) -> bool:
        """Block until every tracked worker holds the newest published version; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._lagging():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def verify_eval_weight_consistency(
        self, rtol: float | None = None, *, timeout: float = 60.0
    ) -> ConsistencyReport:
        """Wait for the update, then compare every worker's fingerprint with the trainer's for that version.

        A worker still behind after ``timeout`` counts as a mismatch (parameter ``<version>``).
        """
        self.wait_for_eval_weight_update(timeout)
        tol = self.rtol if rtol is None else rtol
        with self._cond:
            published = self._published
            train = self._train_fingerprints.get(published) if published is not None else None
            workers = list(self._workers.values())
            behind = set(self._lagging())
        mismatches: list[Mismatch] = []
        for w in workers:
            if w.worker_id in behind and published is not None:
                mismatches.append(
                    Mismatch(w.worker_id, "<version>", float(published[1]), float(w.version), math.inf)
                )
            elif train is not None:
                mismatches += compare_fingerprints(train, w.fingerprint, rtol=tol, worker_id=w.worker_id)
        return ConsistencyReport(
            not mismatches, tuple(sorted(w.worker_id for w in workers)), tuple(mismatches)
        )

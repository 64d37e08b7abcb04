"""Fragments refused for their trajectories, per eval pod, and the pods evicted for them.

Pure: no I/O, no clock. The coordinator records here every push refused at the edge because its
trajectories do not fit the job (``data.spaces``, ``data.schema``) and every acknowledged
fragment it quarantines (taken back from the journal and failing the same checks). Counts are
per pod name, not per registration, so a pod cannot clear its record by registering again. A
pod refused :data:`EVICT_AFTER_REFUSALS` times is evicted: its worker is removed (its leases go
to the others) and the pod may not register again for the rest of this coordinator's life. A
refusal for differing from the schema learned from the first fragment accepted is shown but not
counted: that schema is the first pusher's word, and an insider who pushed first must not get
honest pods evicted.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

#: Refused or quarantined fragments after which a pod is evicted: one is a bug report, three a pattern.
EVICT_AFTER_REFUSALS = 3
#: Refusals kept for status (the newest).
RECENT_REFUSALS = 8


def public_task(task_id: str) -> str:
    """A task id's public part (``e3-f1``); the rest only its lease holder was told."""
    return task_id.rsplit(".", 1)[0]


def pod_of(worker: str) -> str:
    """The pod part of a worker's public name (``pod#n``): what refusals are counted by."""
    return worker.partition("#")[0] or worker


@dataclass(frozen=True)
class RefusalRecord:
    worker: str  # public name, pod#n
    task: str  # public part of the task id
    reason: str
    quarantined: bool = False
    evicted: bool = False


@dataclass
class RefusalLedger:
    evict_after: int = EVICT_AFTER_REFUSALS
    refused: int = 0
    quarantined: int = 0
    by_pod: Counter[str] = field(default_factory=Counter)
    recent: deque[RefusalRecord] = field(default_factory=lambda: deque(maxlen=RECENT_REFUSALS))
    #: pod name -> why it was evicted
    evicted: dict[str, str] = field(default_factory=dict)

    def record(
        self, *, worker: str, task_id: str, reason: str, quarantined: bool = False, counts: bool = True
    ) -> RefusalRecord:
        """Count one refusal of ``worker``'s fragment; the record says whether it evicts the pod.

        ``counts``: False for a refusal that is not surely the sender's fault (a difference from the
        schema learned from another worker's fragment): shown, but no step towards eviction.
        """
        pod = pod_of(worker)
        if quarantined:
            self.quarantined += 1
        else:
            self.refused += 1
        if counts:
            self.by_pod[pod] += 1
        evicts = counts and pod not in self.evicted and self.by_pod[pod] >= self.evict_after
        if evicts:
            self.evicted[pod] = f"{self.by_pod[pod]} fragments refused; the last: {reason}"
        record = RefusalRecord(worker, public_task(task_id), reason, quarantined, evicts)
        self.recent.append(record)
        return record

    def barred(self, pod_name: str) -> str | None:
        """Why ``pod_name`` may not register (None: it may)."""
        return self.evicted.get(pod_name or "worker")  # unnamed workers are "worker#n" (membership)

    def of_pod(self, pod_name: str) -> int:
        return self.by_pod.get(pod_name, 0)

"""The status refresher with a fake reconciler: when it refreshes a job, and which body it refreshes."""

from __future__ import annotations

import asyncio
import copy
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from rlkube_operator.reconcile import Outcome
from rlkube_operator.refresher import Refresher

from tests.conftest import MINIMAL_JOB


class FakeReconciler:
    def __init__(self) -> None:
        self.finished: set[str] = set()
        self.refreshed: list[tuple[float, str]] = []

    def refresh(self, body: dict[str, Any], *, now: datetime | None = None) -> Outcome:
        self.refreshed.append((time.monotonic(), body["metadata"]["resourceVersion"]))
        return Outcome()


def body(version: str, **status: Any) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL_JOB)
    document["metadata"].update({"namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": version})
    if status:
        document["status"] = status
    return document


async def run_for(refresher: Refresher, seconds: float) -> None:
    task = asyncio.get_running_loop().create_task(refresher.run())
    await asyncio.sleep(seconds)
    task.cancel()


def test_a_new_job_is_refreshed_at_once_and_then_every_interval() -> None:
    reconciler = FakeReconciler()
    refresher = Refresher(reconciler=reconciler, kube=None, interval=0.3)  # type: ignore[arg-type]

    async def scenario() -> None:
        refresher.seen("ADDED", body("1"))
        await run_for(refresher, 1.0)

    start = time.monotonic()
    asyncio.run(scenario())
    times = [at - start for at, _ in reconciler.refreshed]
    assert times[0] < 0.2
    assert 2 <= len(times) <= 5


def test_a_ttl_that_runs_out_between_two_refreshes_is_refreshed_when_it_does() -> None:
    reconciler = FakeReconciler()
    refresher = Refresher(reconciler=reconciler, kube=None, interval=30.0)  # type: ignore[arg-type]
    finished = (datetime.now(UTC) - timedelta(seconds=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job = body("1", phase="Complete", completionTime=finished)
    job["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 5}

    async def scenario() -> None:
        refresher.seen("ADDED", job)
        await run_for(refresher, 2.5)

    asyncio.run(scenario())
    assert len(reconciler.refreshed) == 2  # at once, and when the TTL ran out (not 30 s later)


def test_an_older_body_does_not_replace_a_newer_one() -> None:
    refresher = Refresher(reconciler=FakeReconciler(), kube=None, interval=5.0)  # type: ignore[arg-type]

    async def scenario() -> None:
        refresher.seen("MODIFIED", body("7"))
        refresher.seen("MODIFIED", body("5"))

    asyncio.run(scenario())
    held = refresher.body("ns", "cartpole")
    assert held is not None
    assert held["metadata"]["resourceVersion"] == "7"


def test_a_deleted_job_is_forgotten() -> None:
    refresher = Refresher(reconciler=FakeReconciler(), kube=None, interval=5.0)  # type: ignore[arg-type]

    async def scenario() -> None:
        refresher.seen("ADDED", body("1"))
        refresher.seen("DELETED", body("2"))

    asyncio.run(scenario())
    assert refresher.body("ns", "cartpole") is None
    assert refresher.due == {}

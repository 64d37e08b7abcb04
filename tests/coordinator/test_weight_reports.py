"""Only a member's weight report counts: the end of a run never waits for a worker nobody knows."""

from __future__ import annotations

import pytest
from rlkube.coordinator.state import Coordinator, NotRegistered
from rlkube.spec import parse_job
from rlkube.weights.consistency import WorkerLoad

from tests.conftest import MINIMAL_JOB


def load(worker_id: str, version: int, incarnation: str) -> WorkerLoad:
    return WorkerLoad(worker_id=worker_id, node_name="node-0", incarnation=incarnation, version=version)


def test_a_report_from_a_worker_of_a_previous_coordinator_is_refused_and_not_waited_for() -> None:
    coordinator = Coordinator(parse_job(MINIMAL_JOB))
    member = coordinator.register(pod_name="eval-0", node_name="node-0", replica_index=0, num_envs=4)
    coordinator.loads.published(coordinator.incarnation, 3)

    # eval-1 registered with the coordinator before a restart and reports before it notices.
    with pytest.raises(NotRegistered):
        coordinator.report_loaded(load("eval-1#7", 2, "old-incarnation"))
    coordinator.report_loaded(load(member.worker_id, 3, coordinator.incarnation))

    assert coordinator.loads.lagging() == []
    assert coordinator.loads.wait_for_eval_weight_update(timeout=0.0)
    assert [w.worker_id for w in coordinator.loads.workers()] == [member.worker_id]


def test_a_report_after_the_worker_expired_is_refused() -> None:
    now = [0.0]
    coordinator = Coordinator(parse_job(MINIMAL_JOB), lease_seconds=5.0, clock=lambda: now[0])
    worker = coordinator.register(pod_name="eval-0", node_name="node-0", replica_index=0, num_envs=4)
    now[0] = 10.0
    assert [d.worker_id for d in coordinator.expire()] == [worker.worker_id]
    with pytest.raises(NotRegistered):
        coordinator.report_loaded(load(worker.worker_id, 1, coordinator.incarnation))
    assert coordinator.loads.workers() == []

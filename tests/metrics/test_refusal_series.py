"""Rank 0's /metrics counts refused and quarantined fragments and evicted eval pods, from the coordinator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rlkube.coordinator.edge import Refused
from rlkube.coordinator.refusals import EVICT_AFTER_REFUSALS
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.tasks import TaskSpec
from rlkube.data.fragment import Fragment
from rlkube.engine.pod_metrics import bind_coordinator
from rlkube.metrics import series
from rlkube.metrics.server import MetricsServer
from rlkube.spec import parse_job

from tests.metrics.scrape import scrape, value
from tests.security.live import CARTPOLE_SPACES, JOB, NUM_ENVS, trajectories


@pytest.fixture
def coordinator() -> Iterator[Coordinator]:
    coord = Coordinator(parse_job(JOB), spaces=CARTPOLE_SPACES)
    bind_coordinator(coord)
    yield coord
    bind_coordinator(None)


def test_refused_fragments_and_evicted_pods_are_series_of_rank_zero(coordinator: Coordinator) -> None:
    coordinator.open_epoch(epoch=1, version=0)
    worker = coordinator.register(pod_name="intruder", node_name="n0", replica_index=0, num_envs=NUM_ENVS)
    for _ in range(EVICT_AFTER_REFUSALS):
        task = coordinator.lease(worker.worker_id, wait_seconds=0)
        assert isinstance(task, TaskSpec)
        poison = trajectories()
        poison["action"][0, 0] = 7
        with pytest.raises(Refused):
            coordinator.push(task_id=task.task_id, worker_id=worker.worker_id, fragment=Fragment(poison))
    with MetricsServer([series.RANK_ZERO], port=0, host="127.0.0.1") as server:
        scraped = scrape(f"http://127.0.0.1:{server.port}/metrics")
    assert value(scraped, "rlkube_fragments_refused_total") == EVICT_AFTER_REFUSALS
    assert value(scraped, "rlkube_fragments_quarantined_total") == 0
    assert value(scraped, "rlkube_train_eval_pods_evicted") == 1

"""The coordinator remembers when the first eval worker joined: the start-up a run's wall time includes."""

from __future__ import annotations

from rlkube.coordinator.state import Coordinator
from rlkube.spec import parse_job

from tests.conftest import MINIMAL_JOB


def test_only_the_first_registration_of_a_run_is_its_start() -> None:
    now = [100.0]
    coordinator = Coordinator(parse_job(MINIMAL_JOB), clock=lambda: now[0])
    assert coordinator.first_registration_at is None
    now[0] = 102.5
    coordinator.register(pod_name="eval-0", node_name="node-0", replica_index=0, num_envs=4)
    now[0] = 110.0
    coordinator.register(pod_name="eval-1", node_name="node-1", replica_index=1, num_envs=4)
    coordinator.register(pod_name="eval-0", node_name="node-0", replica_index=0, num_envs=4)  # a restart
    assert coordinator.first_registration_at == 102.5

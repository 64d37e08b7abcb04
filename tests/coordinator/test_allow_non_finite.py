"""``spec.env.allowNonFinite`` passes NaN and Inf in what the env wrote, not in what the policy did."""

from __future__ import annotations

import copy
import math

import pytest
from rlkube.coordinator.edge import Refused
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.tasks import TaskSpec
from rlkube.data.fragment import Fragment
from rlkube.spec import parse_job
from tensordict import TensorDict

from tests.security.live import CARTPOLE_SPACES, JOB, NUM_ENVS, trajectories


def push(coord: Coordinator, worker_id: str, data: TensorDict) -> bool:
    task = coord.lease(worker_id, wait_seconds=0)
    assert isinstance(task, TaskSpec)
    return coord.push(task_id=task.task_id, worker_id=worker_id, fragment=Fragment(data)).accepted


def with_nan(key: str) -> TensorDict:
    data = trajectories()
    data[key][0, 1] = math.nan
    return data


@pytest.mark.parametrize("allow", [False, True], ids=["default", "allowNonFinite"])
def test_non_finite_observations_and_rewards_pass_only_when_the_job_allows_them(allow: bool) -> None:
    job = copy.deepcopy(JOB)
    job["spec"]["env"]["allowNonFinite"] = allow
    coord = Coordinator(parse_job(job), spaces=CARTPOLE_SPACES)
    coord.open_epoch(epoch=1, version=0)
    worker = coord.register(pod_name="eval-0", node_name="n0", replica_index=0, num_envs=NUM_ENVS)
    if allow:
        assert push(coord, worker.worker_id, with_nan("observation"))
    else:
        with pytest.raises(Refused, match="observation holds 4 non-finite values"):
            push(coord, worker.worker_id, with_nan("observation"))
    with pytest.raises(Refused, match="log_prob holds 1 non-finite values"):
        push(coord, worker.worker_id, with_nan("log_prob"))

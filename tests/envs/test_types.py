"""RLightning's EnvRet and PolicyResponse surface: field names, timing probes, devices, splitting a batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rlkube.envs.group import EnvGroup
from rlkube.types import EnvRet, PolicyResponse


def test_an_env_ret_has_rlightning_s_fields_and_defaults() -> None:
    ret = EnvRet(env_id="0-3", observation=np.zeros(4, np.float32), extra_field=5)
    assert ret.env_id == "0-3"
    assert isinstance(ret.observation, torch.Tensor)
    assert ret.observation.shape == (4,)
    assert (ret.last_reward, ret.last_terminated, ret.last_truncated) == (0.0, False, False)
    assert ret.info == {}
    assert ret.extra_field == 5
    assert ret.extra == {"extra_field": 5}
    assert ret.reward == ret.last_reward  # rlkube's older spelling still reads
    assert ret.done is False


def test_timing_probes_measure_from_the_mark() -> None:
    ret = EnvRet(env_id="0-0", observation=torch.zeros(1))
    assert ret.compute_sent_latency() == 0.0  # never marked
    ret.mark_env_sent()
    assert ret.ts_env_sent_ns is not None
    assert ret.compute_sent_latency() >= 0.0
    response = PolicyResponse(env_id="0-0", action=1)
    response.mark_policy_sent()
    assert response.compute_sent_latency() >= 0.0


def test_device_helpers_move_tensors_and_keep_the_rest() -> None:
    ret = EnvRet(env_id="0-0", observation=torch.ones(2), last_reward=1.5)
    as_numpy = ret.numpy()
    assert isinstance(as_numpy.observation, np.ndarray)
    assert as_numpy.last_reward == 1.5
    assert torch.equal(ret.cpu().observation, ret.observation)
    assert ret.cuda().observation.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_policy_response_without_env_id_says_how_to_build_one() -> None:
    with pytest.raises(TypeError, match=r"PolicyResponse needs env_id as its first argument"):
        PolicyResponse(action=1)


def test_a_group_s_batch_splits_into_one_request_per_env() -> None:
    with EnvGroup("CartPole-v1", num_envs=3, seed=5, replica=2) as group:
        group.reset()
        batch = group.step(torch.tensor([0, 1, 0]))
    requests = batch.split()
    assert [r.env_id for r in requests] == ["2-0", "2-1", "2-2"]
    for i, request in enumerate(requests):
        assert torch.equal(request.observation, batch.observation[i])
        assert request.last_reward == float(batch.last_reward[i])
        assert isinstance(request.last_terminated, bool)
        assert torch.equal(request.final_observation, batch.final_observation[i])
        assert isinstance(request.info, dict)

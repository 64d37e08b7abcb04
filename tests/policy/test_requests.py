"""One request per env, as in RLightning: what rollout_step receives and must return, in both modes.

Driven through the rollout loop that eval workers and the in-process engine share, on the counter
env (observation ``[steps so far, seed]``, reward = action, episodes of 3 steps).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from rlkube.engine.requests import RequestError
from rlkube.engine.rollout import RolloutWorker
from rlkube.envs.group import EnvGroup
from rlkube.policy import BasePolicy, RequestMode
from rlkube.spec import PolicySpec
from rlkube.types import EnvRet, PolicyResponse
from torch import nn

COUNTER = "tests.envs.counter_env"


class PerEnvPolicy(BasePolicy):
    """Written to the guide: one env's EnvRet in, ``unsqueeze(0)``, one PolicyResponse out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[EnvRet] = []
        self.postprocessed: list[tuple[EnvRet, PolicyResponse]] = []

    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        self.net = nn.Linear(2, 1)

    def setup_optimizer(self, optim_cfg: Any) -> None:
        pass

    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        self.seen.append(env_ret)
        obs = env_ret.observation.float().unsqueeze(0)
        return PolicyResponse(
            env_id=env_ret.env_id,
            action=torch.ones(1, dtype=torch.long),
            value=self.net(obs).squeeze(-1),
            step=obs[:, 0],
        )

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        assert env_ret is not None
        assert policy_resp is not None
        self.postprocessed.append((env_ret, policy_resp))
        return {"bonus": env_ret.last_reward * 2}

    def update_dataset(self, data: Any) -> None:
        self.dataset = data

    def train(self, *args: Any, **kwargs: Any) -> Any:
        return {}


class AsyncPerEnvPolicy(PerEnvPolicy):
    """An ``async def rollout_step`` that yields while in flight and records how many requests were."""

    peak = 0

    async def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:  # type: ignore[override]
        await asyncio.sleep(0)
        self.peak = max(self.peak, self.get_num_requests())
        await asyncio.sleep(0)
        return PerEnvPolicy.rollout_step(self, env_ret)


class BatchedPolicy(PerEnvPolicy):
    """The same policy written for the batched fast path."""

    request_mode = RequestMode.BATCHED

    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        obs = env_ret.observation.float()
        n = obs.shape[0]
        return PolicyResponse(
            env_id=env_ret.env_id,
            action=torch.ones(n, dtype=torch.long),
            value=self.net(obs).squeeze(-1),
            step=obs[:, 0],
        )

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        assert env_ret is not None
        return {"bonus": env_ret.last_reward * 2}


def make_worker(cls: type[BasePolicy], *, num_envs: int = 3, mode: str = "sync") -> RolloutWorker:
    group = EnvGroup("RlkubeCounter-v0", num_envs=num_envs, imports=[COUNTER], seed=0, replica=1)
    group.reset()
    policy = cls(
        PolicySpec.model_validate({"rolloutMode": mode, "weightBuffer": {"strategy": "None"}}), "eval"
    )
    policy.init_eval(env_meta=group.meta)
    return RolloutWorker(group, policy, replica=1)


def collect(cls: type[BasePolicy], steps: int = 4, **kwargs: Any) -> tuple[RolloutWorker, Any]:
    worker = make_worker(cls, **kwargs)
    try:
        return worker, worker.collect(steps)
    finally:
        worker.env_group.close()
        worker.policy.close()


def test_rollout_step_receives_one_env_s_request_with_rlightning_s_fields() -> None:
    worker, _ = collect(PerEnvPolicy, steps=4)
    policy = worker.policy
    assert isinstance(policy, PerEnvPolicy)
    assert len(policy.seen) == 4 * 3
    first, second, third = policy.seen[:3]
    assert [first.env_id, second.env_id, third.env_id] == ["1-0", "1-1", "1-2"]
    assert first.observation.shape == (2,)  # exactly what the env produced: no batch dimension
    assert first.observation.tolist() == [0.0, 0.0]  # [steps so far, seed]; env i is seeded 0 + i
    assert (first.last_reward, first.last_terminated, first.last_truncated) == (0.0, False, False)
    step3 = policy.seen[3 * 3]  # env 0 after its episode ended at step 3
    assert step3.last_terminated is True
    assert step3.last_reward == 1.0
    assert step3.observation.tolist() == [0.0, 0.0]  # the next episode's first frame
    assert step3.final_observation.tolist() == [3.0, 0.0]  # the frame the episode ended on
    assert isinstance(first.info, dict)


def test_postprocess_is_called_per_env_with_that_env_s_result_and_response() -> None:
    worker, fragment = collect(PerEnvPolicy, steps=2)
    policy = worker.policy
    assert isinstance(policy, PerEnvPolicy)
    assert [(r.env_id, p.env_id) for r, p in policy.postprocessed[:3]] == [
        ("1-0", "1-0"),
        ("1-1", "1-1"),
        ("1-2", "1-2"),
    ]
    assert fragment.data["bonus"].tolist() == [[2.0, 2.0]] * 3


def test_per_env_and_batched_policies_fill_the_same_fragment() -> None:
    _, per_env = collect(PerEnvPolicy, steps=4)
    _, batched = collect(BatchedPolicy, steps=4)
    assert set(per_env.data.keys()) == set(batched.data.keys())
    for key in per_env.data.keys():  # noqa: SIM118  (iterating a TensorDict yields rows)
        assert per_env.data[key].shape == batched.data[key].shape, key
        assert per_env.data[key].dtype == batched.data[key].dtype, key
    assert per_env.data.batch_size == (3, 4)
    assert per_env.data["action"].shape == (3, 4)  # the leading 1 of each env's response was its batch of one
    assert per_env.data["value"].shape == (3, 4)
    assert torch.equal(per_env.data["step"], batched.data["step"])
    assert torch.equal(per_env.data["observation"], batched.data["observation"])


def test_async_requests_of_every_env_are_in_flight_together() -> None:
    worker, fragment = collect(AsyncPerEnvPolicy, steps=3, num_envs=4, mode="async")
    assert worker.policy.peak == 4  # get_num_requests() saw every env's request admitted at once
    assert worker.policy.get_num_requests() == 0
    assert fragment.data.batch_size == (4, 3)


def test_a_batched_answer_to_a_per_env_request_names_the_mode_the_shapes_and_the_switch() -> None:
    class AnswersForAll(PerEnvPolicy):
        def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
            return PolicyResponse(env_id=env_ret.env_id, action=torch.ones(3, dtype=torch.long))

    with pytest.raises(RequestError) as error:
        collect(AnswersForAll, steps=1)
    message = str(error.value)
    assert "rolloutMode sync, one request per env" in message
    assert "action of shape (3,)" in message
    assert "observation has shape (2,)" in message
    assert "request_mode = RequestMode.BATCHED" in message


def test_a_per_env_answer_in_batched_mode_names_the_mode_the_shapes_and_the_switch() -> None:
    class Unsqueezes(BatchedPolicy):
        def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
            obs = env_ret.observation.float().unsqueeze(0)
            return PolicyResponse(env_id=env_ret.env_id, action=torch.ones(obs.shape[:2], dtype=torch.long))

    with pytest.raises(RequestError) as error:
        collect(Unsqueezes, steps=1)
    message = str(error.value)
    assert "rolloutMode sync, batched requests" in message
    assert "observation (3, 2)" in message
    assert "action of shape (1, 3)" in message
    assert "remove `request_mode = RequestMode.BATCHED`" in message


def test_a_dict_or_a_response_without_env_id_names_policy_response() -> None:
    class ReturnsDict(PerEnvPolicy):
        def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> Any:
            return {"env_id": env_ret.env_id, "action": 1}

    with pytest.raises(RequestError, match=r"returned a dict .*return PolicyResponse\(env_id=env_ret.env_id"):
        collect(ReturnsDict, steps=1)

    class NoEnvId(PerEnvPolicy):
        def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> Any:
            return PolicyResponse(action=1)

    with pytest.raises(TypeError, match=r"PolicyResponse needs env_id as its first argument"):
        collect(NoEnvId, steps=1)

    class WrongEnvId(PerEnvPolicy):
        def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> Any:
            return PolicyResponse(env_id="other", action=1)

    with pytest.raises(RequestError, match=r"request of env '1-0' with env_id 'other'"):
        collect(WrongEnvId, steps=1)


def test_concurrent_async_requests_leave_inference_mode_as_they_found_it() -> None:
    class Checks(AsyncPerEnvPolicy):
        async def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:  # type: ignore[override]
            assert torch.is_inference_mode_enabled()  # the base class's promise holds after an await too
            await asyncio.sleep(0)
            assert torch.is_inference_mode_enabled()
            return PerEnvPolicy.rollout_step(self, env_ret)

    assert not torch.is_inference_mode_enabled()
    collect(Checks, steps=2, num_envs=4, mode="async")
    assert not torch.is_inference_mode_enabled()  # interleaved requests must not leave it on

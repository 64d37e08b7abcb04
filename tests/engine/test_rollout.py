"""The rollout loop fills [num_envs, T] fragments, keeps envs running across them and plays whole episodes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rlkube.engine.rollout import RolloutWorker
from rlkube.envs.group import EnvGroup
from rlkube.policy import BasePolicy, RequestMode
from rlkube.spec import PolicySpec
from rlkube.types import EnvRet, PolicyResponse
from torch import nn

COUNTER = "tests.envs.counter_env"


class CountingPolicy(BasePolicy):
    """Action 1 (reward 1 per step in the counter env), greedy action 2; written for batched requests."""

    request_mode = RequestMode.BATCHED

    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        self.net = nn.Linear(2, 1)

    def setup_optimizer(self, optim_cfg: Any) -> None:
        pass

    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        n = env_ret.observation.shape[0]
        action = torch.full((n,), 2 if deterministic else 1)
        return PolicyResponse(
            env_id=env_ret.env_id, action=action, log_prob=torch.zeros(n), value=env_ret.observation[:, 0]
        )

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        assert env_ret is not None
        return {"bonus": env_ret.reward * 2}

    def update_dataset(self, data: Any) -> None:
        pass

    def train(self, *args: Any, **kwargs: Any) -> Any:
        pass


class AsyncCountingPolicy(CountingPolicy):
    async def rollout_step(  # type: ignore[override]
        self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any
    ) -> PolicyResponse:
        return CountingPolicy.rollout_step(self, env_ret, deterministic=deterministic)


def worker(cls: type[CountingPolicy] = CountingPolicy, *, limit: int = 3, num_envs: int = 2) -> RolloutWorker:
    group = EnvGroup(
        "RlkubeCounter-v0", num_envs=num_envs, imports=[COUNTER], kwargs={"limit": limit}, seed=0
    )
    group.reset()
    mode = "async" if cls is AsyncCountingPolicy else "sync"
    policy = cls(
        PolicySpec.model_validate({"rolloutMode": mode, "weightBuffer": {"strategy": "None"}}), "eval"
    )
    policy.init_eval(env_meta=group.meta)
    return RolloutWorker(group, policy)


@pytest.mark.parametrize("cls", [CountingPolicy, AsyncCountingPolicy])
def test_a_fragment_holds_every_step_of_every_env(cls: type[CountingPolicy]) -> None:
    w = worker(cls)
    fragment = w.collect(4)
    w.env_group.close()
    data = fragment.data
    assert data.batch_size == torch.Size([2, 4])
    assert set(data.keys()) == {
        "observation",
        "action",
        "log_prob",
        "value",
        "reward",
        "terminated",
        "truncated",
        "next_observation",
        "bonus",
    }
    assert data["observation"][0, :, 0].tolist() == [0.0, 1.0, 2.0, 0.0]
    assert data["terminated"][0].tolist() == [False, False, True, False]
    # the true next observation: the episode's last frame where it ended
    assert data["next_observation"][0, :, 0].tolist() == [1.0, 2.0, 3.0, 1.0]
    assert data["bonus"][0].tolist() == [2.0, 2.0, 2.0, 2.0]
    assert fragment.episode_returns == (3.0, 3.0)
    assert fragment.episode_lengths == (3, 3)
    assert fragment.env_steps == 8


def test_envs_keep_running_across_fragments() -> None:
    w = worker(limit=5)
    first = w.collect(3)
    second = w.collect(3)
    w.env_group.close()
    assert first.data["observation"][0, :, 0].tolist() == [0.0, 1.0, 2.0]
    assert second.data["observation"][0, :, 0].tolist() == [3.0, 4.0, 0.0]
    assert first.episode_returns == ()
    assert second.episode_returns == (5.0, 5.0)


def test_fragments_carry_the_weight_version_they_were_collected_with() -> None:
    w = worker()
    w.policy.weight_version = 7
    fragment = w.collect(1)
    w.env_group.close()
    assert fragment.weight_version == 7


@pytest.mark.parametrize("cls", [CountingPolicy, AsyncCountingPolicy])
def test_evaluation_plays_exactly_the_asked_episodes_greedily(cls: type[CountingPolicy]) -> None:
    w = worker(cls, limit=3, num_envs=2)
    result = w.evaluate(5)
    w.env_group.close()
    assert len(result.returns) == 5
    assert result.returns == (6.0,) * 5  # greedy action 2 -> reward 2 per step
    assert result.lengths == (3,) * 5
    assert result.mean_return == 6.0


def test_collecting_after_evaluation_starts_from_a_reset() -> None:
    w = worker(limit=5)
    w.collect(2)
    w.evaluate(1)
    fragment = w.collect(2)
    w.env_group.close()
    assert fragment.data["observation"][0, :, 0].tolist() == [0.0, 1.0]


def test_a_response_field_that_clashes_with_the_loop_is_refused() -> None:
    class Clashing(CountingPolicy):
        def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
            return PolicyResponse(env_id=env_ret.env_id, action=torch.ones(2, dtype=torch.long), reward=1)

    w = worker(Clashing)
    with pytest.raises(ValueError, match="'reward', which the rollout loop writes itself"):
        w.collect(1)
    w.env_group.close()

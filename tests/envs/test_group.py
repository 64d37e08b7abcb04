"""EnvGroup speaks EnvRet (discrete and continuous), restarts ended episodes and keeps their last frame."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlkube.envs.group import EnvError, EnvGroup, replica_seed

COUNTER = "tests.envs.counter_env"


def test_discrete_group_resets_and_steps_as_a_batch() -> None:
    with EnvGroup("CartPole-v1", num_envs=3, seed=5) as group:
        first = group.reset()
        assert first.observation.shape == (3, 4)
        assert first.env_id == ["0-0", "0-1", "0-2"]
        assert group.meta.is_discrete
        assert group.meta.action_space.n == 2
        assert group.meta.max_episode_steps == 500
        step = group.step(torch.tensor([0, 1, 0]))
        assert step.reward.shape == (3,)
        assert step.reward.dtype == torch.float32
        assert step.terminated.dtype == torch.bool


def test_envs_are_seeded_from_the_group_seed_plus_their_index() -> None:
    with EnvGroup("CartPole-v1", num_envs=2, seed=11) as group:
        batch = group.reset().observation
    single = gym.make("CartPole-v1")
    obs1, _ = single.reset(seed=12)
    single.close()
    assert np.allclose(batch[1].numpy(), obs1)


def test_replicas_get_disjoint_seeds() -> None:
    seeds = {replica_seed(7, r, 4) + i for r in range(3) for i in range(4)}
    assert len(seeds) == 12


def test_continuous_actions_are_clipped_to_the_box() -> None:
    with EnvGroup("Pendulum-v1", num_envs=2, seed=0) as group:
        group.reset()
        assert not group.meta.is_discrete
        assert group._to_env_action(torch.tensor([[5.0], [-0.5]])).tolist() == [[2.0], [-0.5]]
        step = group.step(torch.tensor([[5.0], [-5.0]]))
        assert step.observation.shape == (2, 3)


def test_ended_episode_restarts_and_final_observation_is_its_last_frame() -> None:
    with EnvGroup("RlkubeCounter-v0", num_envs=2, imports=[COUNTER], kwargs={"limit": 2}, seed=3) as group:
        group.reset()
        mid = group.step(torch.tensor([1, 2]))
        assert not mid.terminated.any()
        assert torch.equal(mid.final_observation, mid.observation)
        end = group.step(torch.tensor([1, 2]))
        assert end.terminated.tolist() == [True, True]
        assert end.observation[:, 0].tolist() == [0.0, 0.0]  # already the next episode
        assert end.final_observation[:, 0].tolist() == [2.0, 2.0]  # the frame the episode ended on
        assert end.final_observation[:, 1].tolist() == [3.0, 4.0]
        returns, lengths = group.pop_finished_episodes()
        assert returns == [2.0, 4.0]
        assert lengths == [2, 2]
        assert group.pop_finished_episodes() == ([], [])


def test_truncation_is_reported_with_the_final_observation() -> None:
    with EnvGroup("CartPole-v1", num_envs=2, kwargs={"max_episode_steps": 3}, seed=0) as group:
        group.reset()
        for _ in range(3):
            step = group.step(torch.zeros(2, dtype=torch.long))
        assert step.truncated.all() or step.terminated.all()
        assert not torch.equal(step.final_observation, step.observation)
        assert group.pop_finished_episodes()[1] == [3, 3]


def test_env_kwargs_are_passed_through() -> None:
    with EnvGroup("RlkubeCounter-v0", num_envs=1, imports=[COUNTER], kwargs={"reward_scale": 10.0}) as group:
        group.reset()
        assert group.step(torch.tensor([2])).reward.tolist() == [20.0]


def test_async_vectorization_steps_in_subprocesses() -> None:
    group = EnvGroup("RlkubeCounter-v0", num_envs=2, imports=[COUNTER], vectorization="async", seed=1)
    try:
        group.reset()
        step = group.step(torch.tensor([1, 1]))
        assert step.observation[:, 0].tolist() == [1.0, 1.0]
    finally:
        group.close()


def test_unknown_env_id_names_the_field_and_suggests() -> None:
    with pytest.raises(EnvError, match=r"spec\.env\.id: got 'CartPol-v1'.*CartPole"):
        EnvGroup("CartPol-v1", num_envs=1)


def test_failing_env_import_names_the_field() -> None:
    with pytest.raises(EnvError, match=r"spec\.env\.imports: cannot import 'no_such_module_xyz'"):
        EnvGroup("CartPole-v1", num_envs=1, imports=["no_such_module_xyz"])


def test_bad_kwargs_name_the_field() -> None:
    with pytest.raises(EnvError, match=r"spec\.env\.kwargs"):
        EnvGroup("RlkubeCounter-v0", num_envs=1, imports=[COUNTER], kwargs={"colour": "red"})


def test_an_action_without_a_row_per_env_is_refused() -> None:
    with EnvGroup("CartPole-v1", num_envs=3) as group:
        group.reset()
        with pytest.raises(EnvError, match="one row per env"):
            group.step(torch.tensor([0, 1]))

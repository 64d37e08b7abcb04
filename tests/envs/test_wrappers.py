"""``spec.env.wrappers`` around a real EnvGroup: order, raw episode returns, Atari helpers, user wrappers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from rlkube.envs.atari import EpisodicLife, FireReset
from rlkube.envs.group import EnvError, EnvGroup
from rlkube.spec import EnvSpec

from tests.envs.wrapper_envs import LivesEnv

IMPORTS = ["tests.envs.counter_env", "tests.envs.wrapper_envs"]


def group(env_id: str, wrappers: list[dict[str, Any]], *, num_envs: int = 2, **env: Any) -> EnvGroup:
    spec = EnvSpec.model_validate(
        {"id": env_id, "numEnvs": num_envs, "imports": IMPORTS, "wrappers": wrappers, **env}
    )
    return EnvGroup.from_spec(spec, base_seed=0)


def play(g: EnvGroup, steps: int, action: int = 1) -> list[Any]:
    g.reset()
    return [g.step(torch.full((g.num_envs,), action)) for _ in range(steps)]


def test_reward_wrappers_change_the_training_reward_but_not_the_reported_returns() -> None:
    # Counter: reward = action per step, 3 steps per episode; the policy sees rewards x 10.
    with group("RlkubeCounter-v0", [{"type": "ScaleReward", "scale": 10.0}]) as g:
        rets = play(g, 3, action=2)
        assert rets[0].reward.tolist() == [20.0, 20.0]
        returns, lengths = g.pop_finished_episodes()
    assert returns == [6.0, 6.0]
    assert lengths == [3, 3]


def test_clip_reward_with_sign_maps_rewards_to_minus_one_zero_one() -> None:
    with group("RlkubeCounter-v0", [{"type": "ClipReward", "sign": True}]) as g:
        assert play(g, 1, action=2)[0].reward.tolist() == [1.0, 1.0]
        assert play(g, 1, action=0)[0].reward.tolist() == [0.0, 0.0]


def test_a_time_limit_outside_truncates_and_the_shortened_episode_is_reported() -> None:
    env = {"kwargs": {"limit": 100}}
    with group("RlkubeCounter-v0", [{"type": "TimeLimit", "maxEpisodeSteps": 2}], **env) as g:
        rets = play(g, 4, action=1)
        assert [r.truncated.tolist() for r in rets] == [[False, False], [True, True]] * 2
        assert g.meta.max_episode_steps == 2
        assert g.pop_finished_episodes() == ([2.0, 2.0, 2.0, 2.0], [2, 2, 2, 2])


def test_episodic_life_ends_an_episode_per_life_but_reports_the_whole_game() -> None:
    # 3 lives x 2 steps, reward 2 per step: the policy sees 3 "episodes", the user one game of
    # return 12 and 8 raw steps (6 played, 2 no-ops EpisodicLife takes instead of resetting).
    with group("RlkubeLives-v0", [{"type": "EpisodicLife"}], num_envs=1) as g:
        rets = play(g, 6, action=2)
        assert [bool(r.terminated[0]) for r in rets] == [False, True, False, True, False, True]
        assert g.pop_finished_episodes() == ([12.0], [8])


def test_fire_reset_presses_fire_after_each_reset() -> None:
    env = FireReset(LivesEnv())
    env.reset(seed=0)
    assert env.unwrapped.actions == [1]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="FIRE"):
        FireReset(EpisodicLife(_NoFire()))


def test_fire_reset_keeps_the_whole_game_that_its_reset_reports() -> None:
    # CleanRL's Atari order: each reset (a new life too) presses FIRE, which plays one step. The
    # game (3 lives x 2 steps, reward 2) is reported when FIRE follows the game's real reset.
    with group("RlkubeLives-v0", [{"type": "EpisodicLife"}, {"type": "FireReset"}], num_envs=1) as g:
        rets = play(g, 3, action=2)
        assert [bool(r.terminated[0]) for r in rets] == [True, True, True]
        assert g.pop_finished_episodes() == ([12.0], [8])  # 6 played steps, 2 no-ops


class _NoFire(LivesEnv):
    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "UP"]


def test_frame_stack_keeps_uint8_frames_with_a_new_leading_axis() -> None:
    with group("RlkubeLives-v0", [{"type": "FrameStack", "stackSize": 4}], num_envs=1) as g:
        first = g.reset()
        assert tuple(first.observation.shape) == (1, 4, 6, 6, 3)
        assert first.observation.dtype == torch.uint8
        assert g.meta.observation_space.shape == (4, 6, 6, 3)


def test_rescale_action_lets_the_policy_act_in_minus_one_to_one() -> None:
    wrappers = [{"type": "RescaleAction", "minAction": -1.0, "maxAction": 1.0}]
    with group("Pendulum-v1", wrappers, num_envs=1) as g:
        space = g.single_action_space
        assert (float(space.low[0]), float(space.high[0])) == (-1.0, 1.0)


def test_a_user_wrapper_registered_in_an_imported_module_is_applied_by_name() -> None:
    custom = [{"type": "Custom", "name": "double_obs", "kwargs": {"factor": 3.0}}]
    with group("RlkubeCounter-v0", custom) as g:
        assert play(g, 1)[0].observation[:, 0].tolist() == [3.0, 3.0]


def test_an_unregistered_user_wrapper_is_refused_naming_its_list_entry() -> None:
    with pytest.raises(EnvError, match=r"spec\.env\.wrappers\[1\] \(Custom\).*'nope'.*double_obs"):
        group("RlkubeCounter-v0", [{"type": "ClipReward"}, {"type": "Custom", "name": "nope"}])


def test_wrappers_apply_in_list_order() -> None:
    # scale then clip: 2 * 10 -> clipped to 1; clip then scale: 1 * 10.
    scale_then_clip = [{"type": "ScaleReward", "scale": 10.0}, {"type": "ClipReward"}]
    clip_then_scale = list(reversed(scale_then_clip))
    with group("RlkubeCounter-v0", scale_then_clip) as g:
        assert play(g, 1, action=2)[0].reward.tolist() == [1.0, 1.0]
    with group("RlkubeCounter-v0", clip_then_scale) as g:
        assert play(g, 1, action=2)[0].reward.tolist() == [10.0, 10.0]


def test_async_vectorization_builds_the_wrappers_in_each_subprocess() -> None:
    wrappers = [{"type": "ScaleReward", "scale": 10.0}]
    with group("RlkubeCounter-v0", wrappers, vectorization="async") as g:
        assert np.allclose(play(g, 3, action=1)[0].reward.numpy(), 10.0)
        assert g.pop_finished_episodes() == ([3.0, 3.0], [3, 3])


def test_evaluation_episodes_are_whole_raw_games_too() -> None:
    from rlkube.engine.rollout import RolloutWorker
    from rlkube.policy.builtin.ppo import PPO
    from rlkube.spec import PolicySpec

    with group("RlkubeLives-v0", [{"type": "EpisodicLife"}, {"type": "ScaleReward", "scale": 10.0}]) as g:
        g.reset()
        policy = PPO(PolicySpec.model_validate({"type": "PPO", "weightBuffer": {"strategy": "None"}}), "eval")
        policy.init_eval(env_meta=g.meta)
        result = RolloutWorker(g, policy).evaluate(2, deterministic=False, seed=0)
    assert result.returns == (12.0, 12.0)  # 3 lives x 2 steps x reward 2, unscaled, not per life
    assert all(length >= 6 for length in result.lengths)

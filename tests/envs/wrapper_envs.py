"""Test envs and a user wrapper for ``spec.env.wrappers`` (imported through ``spec.env.imports``).

``RlkubeLives-v0``: a fake "game" with ``lives`` lives of ``steps_per_life`` steps each, reward 2
per step (NOOP: nothing happens), and the ``ale.lives()`` / action-meaning interface the Atari wrappers read.
``double_obs``: a user wrapper registered with ``@register_wrapper``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from rlkube.envs.wrappers import register_wrapper


class _Ale:
    def __init__(self, env: LivesEnv) -> None:
        self.env = env

    def lives(self) -> int:
        return self.env.lives_left


class LivesEnv(gym.Env):
    def __init__(self, lives: int = 3, steps_per_life: int = 2) -> None:
        self.lives = lives
        self.steps_per_life = steps_per_life
        self.observation_space = gym.spaces.Box(0, 255, shape=(6, 6, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.ale = _Ale(self)
        self.lives_left = lives
        self._t = 0
        self.resets = 0
        self.actions: list[int] = []

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple:
        super().reset(seed=seed)
        self.lives_left, self._t = self.lives, 0
        self.resets += 1
        return np.zeros((6, 6, 3), dtype=np.uint8), {}

    def step(self, action: Any) -> tuple:
        self.actions.append(int(action))
        if int(action) == 0:  # NOOP: time stands still, no reward
            return np.full((6, 6, 3), self._t, dtype=np.uint8), 0.0, False, False, {}
        self._t += 1
        if self._t % self.steps_per_life == 0:
            self.lives_left -= 1
        obs = np.full((6, 6, 3), self._t, dtype=np.uint8)
        return obs, 2.0, self.lives_left == 0, False, {}


if "RlkubeLives-v0" not in gym.registry:
    gym.register("RlkubeLives-v0", entry_point=LivesEnv)


class DoubleObservation(gym.ObservationWrapper):  # type: ignore[type-arg]
    def __init__(self, env: gym.Env, factor: float = 2.0) -> None:
        super().__init__(env)
        self.factor = factor

    def observation(self, observation: Any) -> Any:
        return observation * self.factor


@register_wrapper("double_obs")
def double_obs(env: gym.Env, factor: float = 2.0) -> gym.Env:
    return DoubleObservation(env, factor)


class FramesEnv(gym.Env):
    """84x84 RGB uint8 frames (HWC), 4 actions, reward 1 for action 1, episodes of 5 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=(84, 84, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self._t = 0

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, size=(84, 84, 3), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: Any) -> tuple:
        self._t += 1
        return self._frame(), float(int(action) == 1), self._t >= 5, False, {}


if "RlkubeFrames-v0" not in gym.registry:
    gym.register("RlkubeFrames-v0", entry_point=FramesEnv)

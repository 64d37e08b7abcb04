"""A tiny registered env for tests: observation = [steps so far, seed]; terminates after ``limit`` steps.

Importing this module registers ``RlkubeCounter-v0`` (what ``spec.env.imports`` is for).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CounterEnv(gym.Env):
    def __init__(self, limit: int = 3, reward_scale: float = 1.0) -> None:
        self.limit = limit
        self.reward_scale = reward_scale
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self._t = 0
        self._seed = -1.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple:
        super().reset(seed=seed)
        if seed is not None:
            self._seed = float(seed)
        self._t = 0
        return np.array([0.0, self._seed], dtype=np.float32), {}

    def step(self, action: Any) -> tuple:
        self._t += 1
        obs = np.array([float(self._t), self._seed], dtype=np.float32)
        return obs, float(action) * self.reward_scale, self._t >= self.limit, False, {}


if "RlkubeCounter-v0" not in gym.registry:
    gym.register("RlkubeCounter-v0", entry_point=CounterEnv)

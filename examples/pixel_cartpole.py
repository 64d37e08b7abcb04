"""CartPole seen as pixels: a small HWC image env for image policies (``RlkubePixelCartPole-v0``).

Importing this module registers the id (name it in ``spec.env.imports``). The dynamics, rewards
and the 500-step limit are gymnasium's CartPole-v1; the observation is a ``40 x 40 x 3`` uint8
frame: channel 0 draws the cart and the pole now, channel 1 the previous frame (so the velocities
can be seen), channel 2 the track. No pygame: the frame is drawn with numpy.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

SIZE = 40
TRACK_ROW = 33
POLE_PIXELS = 20
#: The pole never leans more than 12 degrees before the episode ends; drawn three times as steep.
ANGLE_GAIN = 3.0


def draw(state: np.ndarray) -> np.ndarray:
    """One ``SIZE x SIZE`` channel with the cart and the pole of CartPole ``state`` (x, _, theta, _)."""
    frame = np.zeros((SIZE, SIZE), dtype=np.uint8)
    x, theta = float(state[0]), float(state[2])
    column = round((x + 2.4) / 4.8 * (SIZE - 1))
    column = min(max(column, 0), SIZE - 1)
    frame[TRACK_ROW - 1 : TRACK_ROW + 2, max(column - 3, 0) : column + 4] = 255
    along = np.arange(POLE_PIXELS)
    rows = np.round(TRACK_ROW - 2 - along * np.cos(ANGLE_GAIN * theta)).astype(int)
    columns = np.round(column + along * np.sin(ANGLE_GAIN * theta)).astype(int)
    inside = (rows >= 0) & (rows < SIZE) & (columns >= 0) & (columns < SIZE)
    frame[rows[inside], columns[inside]] = 255
    return frame


class PixelCartPole(gym.Env[np.ndarray, np.int64]):
    """CartPole whose observation is the picture of the current and the previous state."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.inner = CartPoleEnv()
        self.action_space = self.inner.action_space
        self.observation_space = gym.spaces.Box(0, 255, shape=(SIZE, SIZE, 3), dtype=np.uint8)
        self._track = np.zeros((SIZE, SIZE), dtype=np.uint8)
        self._track[TRACK_ROW + 2, :] = 128
        self._previous = np.zeros((SIZE, SIZE), dtype=np.uint8)

    def _observe(self, state: np.ndarray) -> np.ndarray:
        current = draw(state)
        frame = np.stack([current, self._previous, self._track], axis=-1)
        self._previous = current
        return frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple:
        super().reset(seed=seed)
        state, info = self.inner.reset(seed=seed, options=options)
        self._previous = draw(state)
        return self._observe(state), info

    def step(self, action: Any) -> tuple:
        state, reward, terminated, truncated, info = self.inner.step(action)
        return self._observe(state), reward, terminated, truncated, info


if "RlkubePixelCartPole-v0" not in gym.registry:
    gym.register("RlkubePixelCartPole-v0", entry_point=PixelCartPole, max_episode_steps=500)

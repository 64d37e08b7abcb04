"""Atari wrappers gymnasium does not ship: episodic life and fire-on-reset (as in the DQN papers).

I/O only through the wrapped env. Both read the ALE interface of the raw env
(``env.unwrapped.ale``), so they work under gymnasium's ``AtariPreprocessing``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def _lives(env: gym.Env) -> int:
    return int(env.unwrapped.ale.lives())  # type: ignore[attr-defined]


class EpisodicLife(gym.Wrapper):  # type: ignore[type-arg]
    """``terminated`` at every life loss; the game itself is reset only when it is really over.

    After a lost life, ``reset`` takes one no-op step instead of resetting, so the policy sees a
    new "episode" while the raw game (and the raw episode statistics inside) carries on.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = bool(terminated or truncated)
        lives = _lives(self.env)
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, bool(terminated), bool(truncated), info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = _lives(self.env)
        return obs, info


class FireReset(gym.Wrapper):  # type: ignore[type-arg]
    """Press FIRE after every reset (games such as Breakout wait for it before play starts)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        if len(meanings) < 2 or meanings[1] != "FIRE":
            raise ValueError(f"FireReset needs action 1 to be FIRE; this game's actions are {meanings}")

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        # The reset's info is kept under the FIRE step's: it carries the episode that just ended
        # (rlkube.envs.wrappers.EPISODE_KEY), as gymnasium's AtariPreprocessing keeps it.
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, step_info = self.env.step(1)
        info = {**info, **step_info}
        if terminated or truncated:
            obs, again = self.env.reset(**kwargs)
            info = {**info, **again}
        return obs, info

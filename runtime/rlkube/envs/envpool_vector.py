"""The ``envpool`` backend: an envpool env pool that speaks what EnvGroup reads from gymnasium's.

I/O: creates an envpool pool (C++ threads stepping every env). :class:`EnvpoolVector` has the
calls and results EnvGroup uses of a gymnasium vector env in same-step autoreset mode, so the group
has one code path for every backend:

* **Autoreset.** envpool resets an env on the step *after* it ended (gymnasium's next-step mode,
  that step's action ignored). Here, when envs end at a step, they are stepped once more at once
  (their ids only; envpool resets them) and the step returns their new episodes' first
  observations, with the last ones in ``info["final_obs"]`` (mask ``info["_final_obs"]``), as
  gymnasium's ``AutoresetMode.SAME_STEP`` does.
* **Raw episode statistics** under ``info[EPISODE_KEY]`` (mask ``_EPISODE_KEY``), reported when
  the raw game ends: a lost life under ``episodic_life`` is not the end (envpool's
  ``info["terminated"]`` says when the game is over), a truncation is. Returns sum envpool's raw
  reward (Atari: ``info["reward"]``, before ``reward_clip``); lengths are raw env steps (Atari:
  agent steps x frame skip, from ``info["elapsed_step"]``; the reset no-ops are not counted).
* **Seeds.** envpool fixes seeds when the pool is made, so a reset with a new seed makes a new pool
  (env ``i`` seeded ``seed + i``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from rlkube.envs.envpool_options import BACKEND, EnvpoolOptions, envpool_options, unknown_id_message
from rlkube.envs.wrappers import EPISODE_KEY

#: envpool info keys that are its own bookkeeping (ids, the Atari RAM), not the env's.
_DROPPED_INFO = frozenset({"env_id", "players", "ram"})

_INT32 = 2**31


def _envpool() -> Any:
    try:
        import envpool
    except ImportError as exc:
        raise ValueError(
            f"spec.env.vectorization: {BACKEND} needs the envpool package (pip install envpool, or "
            f"rlkube[envs]): {exc}"
        ) from None
    return envpool


def resolve(env_id: str, *, kwargs: Any, wrappers: Any) -> EnvpoolOptions:
    """Check that envpool has ``env_id`` and can apply ``wrappers``; ValueError names the field."""
    envpool = _envpool()
    known = envpool.list_all_envs()
    task_id = env_id.removeprefix("ALE/")
    if task_id not in known:
        raise ValueError(unknown_id_message(env_id, known))
    config_keys = tuple(envpool.make_spec(task_id).config._fields)
    return envpool_options(env_id, kwargs=kwargs, wrappers=wrappers, config_keys=config_keys)


class EnvpoolVector:
    """``num_envs`` envs of one envpool task; ``reset(seed=)`` and ``step(actions)`` as gymnasium's."""

    def __init__(self, options: EnvpoolOptions, *, num_envs: int) -> None:
        self.options = options
        self.num_envs = num_envs
        self._seed: int | None = None
        self._pool: Any = None
        try:  # the spec alone: no pool, no threads
            spec = _envpool().make_spec(options.task_id, num_envs=1, **options.options)
        except (TypeError, AssertionError, ValueError) as exc:
            raise ValueError(f"spec.env: {BACKEND} refused {options.task_id}: {exc}") from exc
        self.single_action_space: gym.Space[Any] = spec.gymnasium_action_space
        observation_space = spec.gymnasium_observation_space
        self.max_episode_steps = int(spec.config.max_episode_steps)
        if options.drop_stack_axis:
            observation_space = gym.spaces.Box(
                low=observation_space.low[0], high=observation_space.high[0], dtype=observation_space.dtype
            )
        self.single_observation_space: gym.Space[Any] = observation_space
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self._returns = np.zeros(num_envs, dtype=np.float64)

    def _make(self, seed: int, *, num_envs: int) -> Any:
        seeds = [(seed + i) % _INT32 for i in range(num_envs)]
        try:
            return _envpool().make_gymnasium(
                self.options.task_id, num_envs=num_envs, env_seed=seeds, **self.options.options
            )
        except (TypeError, AssertionError, RuntimeError) as exc:
            raise ValueError(f"spec.env: {BACKEND} refused {self.options.task_id}: {exc}") from exc

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Every env starts a new episode; with a seed other than the pool's, in a new pool."""
        del options
        if self._pool is None or (seed is not None and seed != self._seed):
            self.close()
            self._seed = seed if seed is not None else 0
            self._pool = self._make(self._seed, num_envs=self.num_envs)
        obs, info = self._pool.reset()
        self._returns[:] = 0.0
        order = np.argsort(info["env_id"])
        return self._obs(obs)[order], self._info(info, order)

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env; envs whose episode ended are reset within this step (see the module doc)."""
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        order = np.argsort(info["env_id"])
        obs, reward = self._obs(obs)[order], np.asarray(reward)[order]
        terminated, truncated = np.asarray(terminated, bool)[order], np.asarray(truncated, bool)[order]
        out = self._info(info, order)
        self._returns += self._raw_reward(reward, info)[order]
        done = terminated | truncated
        if done.any():
            ended = np.flatnonzero(done).astype(np.int32)
            first, first_reward, *_, reset_info = self._pool.step(np.asarray(actions)[ended], env_id=ended)
            rows = np.asarray(reset_info["env_id"])
            final = obs  # a copy already (indexed by order): the reset below does not change it
            obs = obs.copy()
            obs[rows] = self._obs(first)
            game_over = (
                np.asarray(out.get("terminated", terminated), dtype=bool) if self.options.is_atari else done
            )
            real_end = truncated | (terminated & game_over)
            lengths = np.asarray(out["elapsed_step"], dtype=np.int64) * self.options.frames_per_step
            out["final_obs"], out["_final_obs"] = final, done
            out[EPISODE_KEY] = {"r": self._returns.copy(), "l": lengths}
            out[f"_{EPISODE_KEY}"] = real_end
            self._returns[real_end] = 0.0
            self._returns[rows] += self._raw_reward(first_reward, reset_info)  # a lost life's reset
        return obs, reward, terminated, truncated, out

    def _raw_reward(self, reward: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        """envpool's Atari reward before ``reward_clip`` is ``info["reward"]``."""
        raw = info["reward"] if self.options.is_atari and "reward" in info else reward
        return np.asarray(raw, dtype=np.float64)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        return obs[:, 0] if self.options.drop_stack_axis else obs

    @staticmethod
    def _info(info: dict[str, Any], order: np.ndarray) -> dict[str, Any]:
        return {
            key: np.asarray(value)[order]
            for key, value in info.items()
            if key not in _DROPPED_INFO and not isinstance(value, dict)
        }

    def close(self, **kwargs: Any) -> None:
        del kwargs
        if self._pool is not None:
            self._pool.close()
            self._pool = None

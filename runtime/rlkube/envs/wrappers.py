"""``spec.env.wrappers`` applied around one env, and the raw episode statistics inside them.

I/O only through the wrapped env. :func:`wrap_env` puts :class:`RawEpisodeStatistics` directly
around the env ``gymnasium.make`` returned (inside every configured wrapper), then each
configured wrapper in order. Raw statistics are reported when the raw env is *reset* after it
stepped: an episodic-life "episode" (a lost life) does not reset the game and is not reported; a
time limit outside it does reset it and is. The group reads them from the reset info under
:data:`EPISODE_KEY`, so a reward wrapper never changes the returns a user is shown.

User wrappers: a module listed in ``spec.env.imports`` registers a factory
``factory(env, **kwargs) -> gym.Env`` with ``@register_wrapper("name")``; a ``Custom`` entry
names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlkube import spec as S
from rlkube.envs.atari import EpisodicLife, FireReset

if TYPE_CHECKING:
    from rlkube.spec import WrapperSpec

#: Info key of a finished raw episode: ``{"r": return, "l": length}``.
EPISODE_KEY = "rlkube_episode"

WrapperFactory = Callable[..., gym.Env]
_USER_WRAPPERS: dict[str, WrapperFactory] = {}


def register_wrapper(name: str) -> Callable[[WrapperFactory], WrapperFactory]:
    """Decorator: make ``factory(env, **kwargs)`` available as ``{type: Custom, name: NAME}``."""

    def decorator(factory: WrapperFactory) -> WrapperFactory:
        existing = _USER_WRAPPERS.get(name)
        if existing is not None and getattr(existing, "__qualname__", None) != getattr(
            factory, "__qualname__", None
        ):
            raise KeyError(f"env wrapper {name!r} is already registered by {existing!r}")
        _USER_WRAPPERS[name] = factory
        return factory

    return decorator


def registered_wrappers() -> list[str]:
    return sorted(_USER_WRAPPERS)


class RawEpisodeStatistics(gym.Wrapper):  # type: ignore[type-arg]
    """Sums the raw env's rewards; reports the episode in the info of the reset that ends it."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._return = 0.0
        self._length = 0

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        if self._length:
            info = {**info, EPISODE_KEY: {"r": self._return, "l": self._length}}
        self._return, self._length = 0.0, 0
        return obs, info


def finished_episodes(info: Mapping[str, Any]) -> list[tuple[int, float, int]]:
    """``(env index, raw return, raw length)`` of the raw episodes a vector step's info reports."""
    episodes = info.get(EPISODE_KEY)
    if episodes is None:
        return []
    mask = info[f"_{EPISODE_KEY}"]
    return [(int(i), float(episodes["r"][i]), int(episodes["l"][i])) for i in np.flatnonzero(mask)]


def _clip(low: float, high: float) -> Callable[[Any], float]:
    return lambda reward: float(np.clip(reward, low, high))


def _one(env: gym.Env, spec: WrapperSpec) -> gym.Env:
    w = gym.wrappers
    if isinstance(spec, S.ClipActionWrapper):
        return w.ClipAction(env)
    if isinstance(spec, S.RescaleActionWrapper):
        low, high = np.float32(spec.min_action), np.float32(spec.max_action)
        return w.RescaleAction(env, min_action=low, max_action=high)
    if isinstance(spec, S.NormalizeRewardWrapper):
        out: gym.Env = w.NormalizeReward(env, gamma=spec.gamma, epsilon=spec.epsilon)
        return w.TransformReward(out, _clip(-spec.clip, spec.clip)) if spec.clip is not None else out
    if isinstance(spec, S.ScaleRewardWrapper):
        scale = spec.scale
        return w.TransformReward(env, lambda reward: float(reward) * scale)
    if isinstance(spec, S.ClipRewardWrapper):
        if spec.sign:
            return w.TransformReward(env, lambda reward: float(np.sign(float(reward))))
        return w.TransformReward(env, _clip(spec.min, spec.max))
    if isinstance(spec, S.FrameStackWrapper):
        return w.FrameStackObservation(env, stack_size=spec.stack_size)
    if isinstance(spec, S.AtariPreprocessingWrapper):
        return w.AtariPreprocessing(
            env,
            noop_max=spec.noop_max,
            frame_skip=spec.frame_skip,
            screen_size=spec.screen_size,
            grayscale_obs=spec.grayscale_obs,
            terminal_on_life_loss=spec.terminal_on_life_loss,
        )
    if isinstance(spec, S.EpisodicLifeWrapper):
        return EpisodicLife(env)
    if isinstance(spec, S.FireResetWrapper):
        return FireReset(env)
    if isinstance(spec, S.TimeLimitWrapper):
        return w.TimeLimit(env, max_episode_steps=spec.max_episode_steps)
    if isinstance(spec, S.CustomWrapper):
        if spec.name not in _USER_WRAPPERS:
            known = ", ".join(registered_wrappers()) or "none"
            raise KeyError(
                f"no env wrapper named {spec.name!r} is registered (registered: {known}); list the "
                "module that registers it (@register_wrapper) in spec.env.imports"
            )
        return _USER_WRAPPERS[spec.name](env, **dict(spec.kwargs))
    raise ValueError(f"env wrapper type {spec.type!r} cannot be applied to an env")


def wrap_env(env: gym.Env, wrappers: Sequence[WrapperSpec]) -> gym.Env:
    """Raw statistics innermost, then ``wrappers`` in order; errors name ``spec.env.wrappers[i]``."""
    return apply_wrappers(RawEpisodeStatistics(env), wrappers)


def apply_wrappers(env: gym.Env, wrappers: Sequence[WrapperSpec]) -> gym.Env:
    """Just ``wrappers`` in order (a peer that records episodes its own way uses this)."""
    out = env
    for index, spec in enumerate(wrappers):
        try:
            out = _one(out, spec)
        except (KeyError, ValueError, TypeError, gym.error.Error, ImportError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise ValueError(f"spec.env.wrappers[{index}] ({spec.type}): {message}") from exc
    return out

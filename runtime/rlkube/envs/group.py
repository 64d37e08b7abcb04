"""EnvGroup: ``numEnvs`` copies of one gymnasium env stepped as a batch, speaking batched EnvRets.

Env ``i`` of eval replica ``r`` has the id ``"r-i"``; the rollout loop splits each batched EnvRet
into one request per env unless the policy declares batched requests (``rlkube.engine.rollout``).

I/O: creates environments (in-process, or in subprocesses with ``vectorization: async``, or in
envpool's C++ threads with ``vectorization: envpool``, :mod:`rlkube.envs.envpool_vector`, which
gives the same results as a gymnasium vector env in the mode below). The group uses gymnasium's
same-step autoreset: when an env's episode ends at a step, the EnvRet of
that step already holds the first observation of its next episode in ``observation``, and the last
observation of the episode that ended in ``final_observation``. ``final_observation`` is a full
``[N, ...]`` tensor: rows of envs that did not end repeat ``observation``, so it is always the true
next observation of the step. Each env is wrapped as ``spec.env.wrappers`` says
(:func:`~rlkube.envs.wrappers.wrap_env`); the episode returns and lengths collected with
:meth:`EnvGroup.pop_finished_episodes` are the *raw* env's, recorded inside every wrapper.

Seeding: env ``i`` of a group is reset with ``seed + i``; the launcher gives replica ``r`` the seed
``train.seed + r * numEnvs`` (:func:`replica_seed`), so no two envs of a job share a seed.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlkube.envs.envpool_options import BACKEND as ENVPOOL
from rlkube.envs.envpool_vector import EnvpoolVector, resolve
from rlkube.envs.types import EnvMeta, EnvRet
from rlkube.envs.wrappers import finished_episodes, wrap_env

if TYPE_CHECKING:
    from rlkube.spec import EnvSpec, WrapperSpec


class EnvError(ValueError):
    """An environment that cannot be made (unknown id, failing import, bad kwargs) or a bad action."""


def replica_seed(base_seed: int, replica_index: int, num_envs: int) -> int:
    """The seed of a replica's first env; its envs use consecutive seeds after it."""
    return base_seed + replica_index * num_envs


def import_env_modules(modules: Iterable[str]) -> None:
    """Import the modules that register custom env ids (``spec.env.imports``)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(f"spec.env.imports: cannot import {module!r}: {exc}") from exc


def check_env_id(env_id: str, imports: Iterable[str] = ()) -> None:
    """Raise :class:`EnvError` naming ``spec.env.id`` unless gymnasium knows ``env_id``."""
    import_env_modules(imports)
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise EnvError(f"spec.env.id: got {env_id!r}, expected a registered gymnasium id ({exc})") from None


def check_env(env: EnvSpec) -> str:
    """Raise :class:`EnvError` naming the field unless ``spec.env`` can be made by its backend.

    Makes no env: gymnasium's registry, or envpool's list and its options for the wrappers.
    Returns what was checked, one line.
    """
    if env.vectorization != ENVPOOL:
        check_env_id(env.id, env.imports)
        return f"spec.env.id: {env.id!r} is a registered gymnasium id"
    import_env_modules(env.imports)
    try:
        options = resolve(env.id, kwargs=_plain(env.kwargs), wrappers=tuple(env.wrappers))
    except ValueError as exc:
        raise EnvError(str(exc)) from None
    return (
        f"spec.env.id: {env.id!r} is envpool's {options.task_id!r} (spec.env.vectorization: envpool), "
        "which applies spec.env.wrappers and kwargs natively"
    )


def _make_env(
    env_id: str, kwargs: Mapping[str, Any], imports: tuple[str, ...], wrappers: tuple[WrapperSpec, ...] = ()
) -> gym.Env:
    # Module level (not a closure) so async vectorization can send it to a subprocess.
    import_env_modules(imports)
    return wrap_env(gym.make(env_id, **dict(kwargs)), wrappers)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class EnvGroup:
    """A batch of envs; ``reset()`` then ``step(action)``, each returning an :class:`EnvRet`."""

    def __init__(
        self,
        env_id: str,
        *,
        num_envs: int,
        kwargs: Mapping[str, Any] | None = None,
        vectorization: str = "sync",
        imports: Iterable[str] = (),
        seed: int = 0,
        clip_actions: bool = True,
        replica: int = 0,
        wrappers: Iterable[WrapperSpec] = (),
    ) -> None:
        if num_envs < 1:
            raise EnvError(f"spec.env.numEnvs: got {num_envs}, expected at least 1")
        self.env_id = env_id
        self.num_envs = num_envs
        self.seed = seed
        self.clip_actions = clip_actions
        imports = tuple(imports)
        env_kwargs = _plain(kwargs or {})
        wrappers = tuple(wrappers)
        self.envs: SyncVectorEnv | AsyncVectorEnv | EnvpoolVector
        if vectorization == ENVPOOL:
            import_env_modules(imports)
            try:
                self.envs = EnvpoolVector(
                    resolve(env_id, kwargs=env_kwargs, wrappers=wrappers), num_envs=num_envs
                )
            except ValueError as exc:
                raise EnvError(str(exc)) from None
            self._max_episode_steps: int | None = self.envs.max_episode_steps
        else:
            self._make_gymnasium(env_id, env_kwargs, vectorization, imports, wrappers)
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        #: ``"<replica>-<index>"``: unique within a job, stable across restarts of the replica.
        self.env_ids: list[str] = [f"{replica}-{i}" for i in range(num_envs)]
        self._finished_returns: list[float] = []
        self._finished_lengths: list[int] = []
        self._meta: EnvMeta | None = None
        self._closed = False

    def _make_gymnasium(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        vectorization: str,
        imports: tuple[str, ...],
        wrappers: tuple[WrapperSpec, ...],
    ) -> None:
        num_envs = self.num_envs
        check_env_id(env_id, imports)
        self._max_episode_steps = env_kwargs.get("max_episode_steps", gym.spec(env_id).max_episode_steps)
        for wrapper in wrappers:
            if wrapper.type == "TimeLimit":
                self._max_episode_steps = wrapper.max_episode_steps  # type: ignore[union-attr]
        factory = functools.partial(_make_env, env_id, env_kwargs, imports, wrappers)
        vector_cls: type[SyncVectorEnv] | type[AsyncVectorEnv]
        if vectorization == "sync":
            vector_cls = SyncVectorEnv
        elif vectorization == "async":
            vector_cls = AsyncVectorEnv
        else:
            raise EnvError(
                f"spec.env.vectorization: got {vectorization!r}, expected 'sync', 'async' or 'envpool'"
            )
        # Async env processes are spawned, never forked: an eval worker has live gRPC threads
        # (its coordinator channel) by the time it builds the evaluation envs.
        options: dict[str, Any] = {"context": "spawn"} if vector_cls is AsyncVectorEnv else {}
        try:
            self.envs = vector_cls([factory] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP, **options)
        except TypeError as exc:  # unexpected keyword arguments of the env constructor
            raise EnvError(f"spec.env.kwargs: {env_id} refused them: {exc}") from exc
        except ValueError as exc:  # a wrapper that does not fit the env (named by wrap_env)
            raise EnvError(str(exc)) from exc

    @classmethod
    def from_spec(cls, env: EnvSpec, *, base_seed: int, replica_index: int = 0) -> EnvGroup:
        """The group of eval replica ``replica_index`` of a job's ``spec.env``."""
        return cls(
            env.id,
            num_envs=env.num_envs,
            kwargs=env.kwargs,
            vectorization=env.vectorization,
            imports=env.imports,
            seed=replica_seed(base_seed, replica_index, env.num_envs),
            replica=replica_index,
            wrappers=env.wrappers,
        )

    @property
    def meta(self) -> EnvMeta:
        """Facts for ``construct_network``; available after the first :meth:`reset`."""
        if self._meta is None:
            raise RuntimeError("EnvGroup.meta is known after the first reset()")
        return self._meta

    def reset(self, seed: int | None = None) -> EnvRet:
        """Reset every env (seed ``seed + i``; default: the group's); unfinished episodes are dropped."""
        first = seed if seed is not None else self.seed
        observation, info = self.envs.reset(seed=first)
        self.envs.action_space.seed(first)
        if self._meta is None:
            self._meta = EnvMeta(
                env_name=self.env_id,
                observation_space=self.single_observation_space,
                action_space=self.single_action_space,
                num_envs=self.num_envs,
                max_episode_steps=self._max_episode_steps,
            )
        obs = torch.as_tensor(np.asarray(observation))
        return EnvRet(
            env_id=list(self.env_ids),
            observation=obs,
            last_reward=torch.zeros(self.num_envs),
            last_terminated=torch.zeros(self.num_envs, dtype=torch.bool),
            last_truncated=torch.zeros(self.num_envs, dtype=torch.bool),
            info=info,
            final_observation=obs,
        )

    def step(self, action: Any) -> EnvRet:
        """Step every env with its row of ``action``; ended episodes restart within this step."""
        observation, reward, terminated, truncated, info = self.envs.step(self._to_env_action(action))
        obs = torch.as_tensor(np.asarray(observation))
        done = np.logical_or(terminated, truncated)
        final = obs
        if done.any():
            final = obs.clone()
            mask = info.get("_final_obs", done)
            for i in np.flatnonzero(mask):
                final[i] = torch.as_tensor(np.asarray(info["final_obs"][i]))
        for _, raw_return, raw_length in finished_episodes(info):  # ended by this step's autoreset
            self._finished_returns.append(raw_return)
            self._finished_lengths.append(raw_length)
        return EnvRet(
            env_id=list(self.env_ids),
            observation=obs,
            last_reward=torch.as_tensor(np.asarray(reward, dtype=np.float32)),
            last_terminated=torch.as_tensor(np.asarray(terminated, dtype=bool)),
            last_truncated=torch.as_tensor(np.asarray(truncated, dtype=bool)),
            info=info,
            final_observation=final,
        )

    def pop_finished_episodes(self) -> tuple[list[float], list[int]]:
        """Returns and lengths of the episodes that ended since the last call."""
        returns, lengths = self._finished_returns, self._finished_lengths
        self._finished_returns, self._finished_lengths = [], []
        return returns, lengths

    def _to_env_action(self, action: Any) -> np.ndarray:
        array = action.detach().cpu().numpy() if isinstance(action, torch.Tensor) else np.asarray(action)
        if array.ndim == 0 or array.shape[0] != self.num_envs:
            raise EnvError(
                f"action has shape {tuple(array.shape)}; expected one row per env ({self.num_envs}, ...)"
            )
        space = self.single_action_space
        if isinstance(space, gym.spaces.Discrete):
            return array.reshape(self.num_envs).astype(np.int64)
        if isinstance(space, gym.spaces.Box):
            array = array.reshape(self.num_envs, *space.shape).astype(space.dtype, copy=False)
            if self.clip_actions:
                array = np.clip(array, space.low, space.high)
            return array
        return array

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.envs.close()

    def __enter__(self) -> EnvGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

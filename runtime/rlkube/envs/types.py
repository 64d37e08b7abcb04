"""What flows between environments and policies: EnvMeta, EnvRet and PolicyResponse.

Pure: no I/O. As in RLightning, an :class:`EnvRet` is one environment's result and one request to
an eval policy: ``env_id`` (a string), the ``observation`` exactly as that env produced it (no
batch dimension), ``last_reward``, ``last_terminated``, ``last_truncated`` (of the step that
produced the observation), that env's ``info``, and extra fields given as keywords (the rollout
loop adds ``final_observation``). A policy that declares batched requests
(``request_mode = RequestMode.BATCHED``, see ``rlkube.policy.base``) instead receives one EnvRet for
every env of the group: ``env_id`` is the list of their ids and every tensor field has one row per
env (``observation [N, ...]``, ``last_reward [N]``, ...); :meth:`EnvRet.split` turns such a batch
into the per-env requests.

A :class:`PolicyResponse` takes ``env_id`` first and any other fields as keywords; every tensor
field is carried through the trajectory plane into ``update_dataset``. Both types have RLightning's
timing helpers (``mark_env_sent``/``mark_policy_sent``, ``compute_sent_latency``) and device helpers
(``to``, ``cpu``, ``cuda``, ``numpy``). ``reward``, ``terminated`` and ``truncated`` are read-only
aliases of the ``last_*`` fields.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

_ALIASES = {"reward": "last_reward", "terminated": "last_terminated", "truncated": "last_truncated"}


def _to_tensor(value: Any) -> Any:
    """numpy arrays become tensors (zero-copy); everything else is kept as given."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value)
    return value


def _move(value: Any, fn: str, *args: Any) -> Any:
    if isinstance(value, torch.Tensor | TensorDict):
        return getattr(value, fn)(*args)
    return value


def _numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value


@dataclass(frozen=True)
class EnvMeta:
    """Environment facts a policy needs to build its networks (from the first reset)."""

    env_name: str
    observation_space: Any  # gymnasium.Space of one env
    action_space: Any  # gymnasium.Space of one env
    num_envs: int
    max_episode_steps: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.observation_space.shape or ())

    @property
    def is_discrete(self) -> bool:
        return hasattr(self.action_space, "n")


class _Fields:
    """Dynamic fields with timing and device helpers shared by EnvRet and PolicyResponse."""

    _fields: dict[str, Any]
    _sent_ns: int | None

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("_fields", {})
        if name in fields:
            return fields[name]
        alias = _ALIASES.get(name)
        if alias is not None and alias in fields:
            return fields[alias]
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (fields: {', '.join(fields)})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._fields[name] = _to_tensor(value)

    def __contains__(self, name: str) -> bool:
        return name in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def keys(self) -> list[str]:
        return list(self._fields)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._fields.items())

    def get(self, name: str, default: Any = None) -> Any:
        return self._fields.get(name, self._fields.get(_ALIASES.get(name, ""), default))

    # ------------------------------------------------------------------ timing (RLightning's probes)
    @property
    def ts_env_sent_ns(self) -> int | None:
        """``time.monotonic_ns()`` when the sender marked this object sent (None until then)."""
        return self._sent_ns

    def mark_env_sent(self) -> None:
        object.__setattr__(self, "_sent_ns", time.monotonic_ns())

    def mark_policy_sent(self) -> None:
        object.__setattr__(self, "_sent_ns", time.monotonic_ns())

    def compute_sent_latency(self) -> float:
        """Seconds since this object was marked sent (0.0 if it never was)."""
        if self._sent_ns is None:
            return 0.0
        return (time.monotonic_ns() - self._sent_ns) / 1e9

    # ------------------------------------------------------------------ devices
    def _replace(self, fn: str, *args: Any) -> Any:
        clone = object.__new__(type(self))
        object.__setattr__(clone, "_fields", {k: _move(v, fn, *args) for k, v in self._fields.items()})
        for key, value in self.__dict__.items():
            if key != "_fields":
                object.__setattr__(clone, key, value)
        return clone

    def to(self, device: str | torch.device) -> Any:
        return self._replace("to", device)

    def cpu(self) -> Any:
        return self._replace("cpu")

    def cuda(self) -> Any:
        """Move to CUDA when it exists; on a CPU-only machine this is the identity (as the hooks expect)."""
        return self._replace("cuda") if torch.cuda.is_available() else self

    def numpy(self) -> Any:
        """A copy whose tensors are numpy arrays (RLightning's ``numpy()``); other fields as they are."""
        clone = self._replace("cpu")
        object.__setattr__(clone, "_fields", {k: _numpy(v) for k, v in clone._fields.items()})
        return clone

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    def to_tensordict(self, batch_size: tuple[int, ...] | None = None) -> TensorDict:
        tensors = {k: v for k, v in self._fields.items() if isinstance(v, torch.Tensor | TensorDict)}
        if batch_size is None:
            env_id = self._fields.get("env_id")
            if isinstance(env_id, list | tuple):
                batch_size = (len(env_id),)
            elif isinstance(env_id, torch.Tensor) and env_id.ndim:
                batch_size = (int(env_id.shape[0]),)
            else:
                batch_size = ()
        return TensorDict(tensors, batch_size=batch_size)

    def __repr__(self) -> str:
        parts = []
        for key, value in self._fields.items():
            if isinstance(value, torch.Tensor):
                parts.append(f"{key}=Tensor{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}")
            else:
                parts.append(f"{key}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


_STANDARD = ("env_id", "observation", "last_reward", "last_terminated", "last_truncated")


class EnvRet(_Fields):
    """One env's result (one request), or with batched requests every env's; see the module docstring.

    For an env whose episode just ended, ``observation`` is already the first observation of its
    next episode and ``final_observation`` holds the last one of the episode that ended (for other
    envs ``final_observation`` is ``observation``), so it is always the true next observation.
    """

    def __init__(
        self,
        env_id: Any,
        observation: Any,
        last_reward: Any = 0.0,
        last_terminated: Any = False,
        last_truncated: Any = False,
        info: Mapping[str, Any] | None = None,
        _extra: Mapping[str, Any] | None = None,
        ts_env_sent_ns: int | None = None,
        **extra: Any,
    ) -> None:
        object.__setattr__(self, "_fields", {})
        object.__setattr__(self, "_sent_ns", ts_env_sent_ns)
        for alias, name in _ALIASES.items():  # EnvRet(reward=...) as rlkube spelled it before
            if alias in extra:
                value = extra.pop(alias)
                if name == "last_reward":
                    last_reward = value
                elif name == "last_terminated":
                    last_terminated = value
                else:
                    last_truncated = value
        self.env_id = env_id
        self.observation = observation
        self.last_reward = last_reward
        self.last_terminated = last_terminated
        self.last_truncated = last_truncated
        object.__setattr__(self, "_info", dict(info or {}))
        for key, value in {**dict(_extra or {}), **extra}.items():
            setattr(self, key, value)

    @property
    def info(self) -> dict[str, Any]:
        return self._info

    @property
    def extra(self) -> dict[str, Any]:
        """The fields beyond RLightning's standard ones (e.g. ``final_observation``)."""
        return {k: v for k, v in self._fields.items() if k not in _STANDARD}

    @property
    def _extra(self) -> dict[str, Any]:  # RLightning's attribute name
        return self.extra

    @property
    def done(self) -> Any:
        if isinstance(self.last_terminated, torch.Tensor):
            return self.last_terminated | torch.as_tensor(self.last_truncated)
        return bool(self.last_terminated) or bool(self.last_truncated)

    @property
    def is_batch(self) -> bool:
        """True for a batched request (every env of a group), False for one env's."""
        env_id = self._fields["env_id"]
        return isinstance(env_id, list | tuple) or (isinstance(env_id, torch.Tensor) and env_id.ndim > 0)

    @property
    def env_ids(self) -> list[str]:
        """The ids as a list of strings (one element for a single env's request)."""
        env_id = self._fields["env_id"]
        if isinstance(env_id, torch.Tensor):
            return [str(v) for v in env_id.reshape(-1).tolist()]
        if isinstance(env_id, list | tuple):
            return [str(v) for v in env_id]
        return [str(env_id)]

    def split(self) -> list[EnvRet]:
        """A batched EnvRet as one request per env: row ``i`` of every field, that env's info."""
        if not self.is_batch:
            return [self]
        ids = self.env_ids
        n = len(ids)
        rewards = _column(self.last_reward, n, float)
        terminated = _column(self.last_terminated, n, bool)
        truncated = _column(self.last_truncated, n, bool)
        extra = self.extra
        return [
            EnvRet(
                env_id,
                _row(self.observation, i, n),
                last_reward=rewards[i],
                last_terminated=terminated[i],
                last_truncated=truncated[i],
                info=info_row(self._info, i),
                ts_env_sent_ns=self._sent_ns,
                **{key: _row(value, i, n) for key, value in extra.items()},
            )
            for i, env_id in enumerate(ids)
        ]


def _column(value: Any, n: int, kind: type) -> list[Any]:
    if isinstance(value, torch.Tensor | np.ndarray) and value.ndim:
        return [kind(v) for v in value.tolist()]
    return [kind(value)] * n


def _row(value: Any, i: int, n: int) -> Any:
    if isinstance(value, torch.Tensor | np.ndarray) and value.ndim and value.shape[0] == n:
        return value[i]
    return value


def info_row(info: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s entries of a gymnasium vector-env info dict (``_key`` masks say which are set)."""
    row: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not bool(np.asarray(mask)[i]):
            continue
        if isinstance(value, Mapping):
            row[key] = info_row(value, i)
        elif isinstance(value, np.ndarray | torch.Tensor) and value.ndim:
            row[key] = value[i]
        else:
            row[key] = value
    return row


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


class PolicyResponse(_Fields):
    """A policy's answer: ``env_id`` first (``env_ret.env_id``), then any fields (``action``, ...)."""

    def __init__(self, env_id: Any = _MISSING, **fields: Any) -> None:
        if env_id is _MISSING or env_id is None:
            raise TypeError(
                "PolicyResponse needs env_id as its first argument: "
                "PolicyResponse(env_id=env_ret.env_id, action=..., ...)"
            )
        object.__setattr__(self, "_fields", {})
        object.__setattr__(self, "_sent_ns", None)
        self.env_id = env_id
        for key, value in fields.items():
            setattr(self, key, value)

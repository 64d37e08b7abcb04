"""What flows between environments and policies: EnvMeta, EnvRet and PolicyResponse.

Pure: no I/O. An :class:`EnvRet` covers every env of one EnvGroup at once (a batch along the
first dimension, ``env_id`` naming each row), which is how RLightning's batched requests reach
``rollout_step``. A :class:`PolicyResponse` takes ``env_id`` first and any other fields as
keywords; every field is carried through the trajectory plane into ``update_dataset``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def _to_tensor(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, bool | int | float):
        return torch.as_tensor(value)
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
    """Dynamic tensor fields with device helpers shared by EnvRet and PolicyResponse."""

    _fields: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("_fields", {})
        if name in fields:
            return fields[name]
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
        return self._fields.get(name, default)

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

    def numpy(self) -> dict[str, Any]:
        return {k: _numpy(v) for k, v in self._fields.items()}

    def to_tensordict(self, batch_size: tuple[int, ...] | None = None) -> TensorDict:
        tensors = {k: v for k, v in self._fields.items() if isinstance(v, torch.Tensor | TensorDict)}
        if batch_size is None:
            env_id = self._fields.get("env_id")
            batch_size = (int(env_id.shape[0]),) if isinstance(env_id, torch.Tensor) and env_id.ndim else ()
        return TensorDict(tensors, batch_size=batch_size)

    def __repr__(self) -> str:
        parts = []
        for key, value in self._fields.items():
            if isinstance(value, torch.Tensor):
                parts.append(f"{key}=Tensor{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}")
            else:
                parts.append(f"{key}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


class EnvRet(_Fields):
    """One step's result for every env of a group: ``observation`` [N, ...], ``reward`` [N], ...

    ``terminated``/``truncated`` refer to the step that produced this observation; for envs that
    just ended, ``observation`` is already the first observation of the next episode and
    ``final_observation`` holds the last one of the episode that ended. ``EnvGroup`` sends
    ``final_observation`` as a full ``[N, ...]`` tensor (rows of envs that did not end repeat
    ``observation``), so it is always the true next observation of the step.
    """

    def __init__(
        self,
        env_id: Any,
        observation: Any,
        reward: Any = None,
        terminated: Any = None,
        truncated: Any = None,
        info: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        object.__setattr__(self, "_fields", {})
        object.__setattr__(self, "_sent_at", time.monotonic())
        self.env_id = env_id
        self.observation = observation
        n = int(self._fields["env_id"].shape[0]) if self._fields["env_id"].ndim else 1
        self.reward = torch.zeros(n) if reward is None else reward
        self.terminated = torch.zeros(n, dtype=torch.bool) if terminated is None else terminated
        self.truncated = torch.zeros(n, dtype=torch.bool) if truncated is None else truncated
        object.__setattr__(self, "_info", info or {})
        for key, value in extra.items():
            setattr(self, key, value)

    @property
    def info(self) -> dict[str, Any]:
        return self._info

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated

    def compute_sent_latency(self) -> float:
        """Seconds since this result was produced (RLightning's transfer-latency probe)."""
        return time.monotonic() - self._sent_at


class PolicyResponse(_Fields):
    """A policy's answer: ``env_id`` first, then any fields (``action``, ``log_prob``, ``value``, ...)."""

    def __init__(self, env_id: Any, **fields: Any) -> None:
        object.__setattr__(self, "_fields", {})
        object.__setattr__(self, "_sent_at", None)
        self.env_id = env_id
        for key, value in fields.items():
            setattr(self, key, value)

    def mark_policy_sent(self) -> None:
        object.__setattr__(self, "_sent_at", time.monotonic())

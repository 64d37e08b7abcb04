"""The job's env spaces, and the checks a fragment's observations and actions must pass against them.

Pure: no I/O. A fragment can be well-formed by the wire's schema and still poison training: an
action 7 for CartPole's two actions reaches ``Categorical.log_prob`` on a train rank and kills
it (and, acknowledged and journalled, kills it again after every restart). So the coordinator
checks every fragment against the spaces of the env train rank 0 built its own networks from
(``launch.train.env_meta``; never a space a worker reports: that would be the sender's word):

* ``observation`` and ``next_observation`` have the observation space's shape and dtype;
* ``action`` has the action space's shape and whole numbers inside a discrete range
  (``Discrete``, ``MultiDiscrete``, ``MultiBinary``: an integer dtype, or floats holding whole
  numbers, which the env casts and ``Categorical.log_prob`` takes; NaN, fractions and bools are
  refused), or finite floats for a ``Box``, inside its bounds only where the policy promises that
  (``BasePolicy.actions_within_bounds``: PPO's Gaussian samples are unbounded and the env clips
  them, so its actions may lie outside).

Every check is one vectorised torch reduction per leaf (no Python loop over elements). Spaces
this module does not know (``Dict``, ``Tuple``, ``Text``, ...) are not checked beyond the
schema and finiteness (``data.schema``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlkube.data.fragment import NEXT_OBSERVATION, OBSERVATION

ACTION = "action"


def _dtype_name(dtype: Any) -> str:
    """numpy's or torch's dtype as torch names it without ``torch.``: ``float32``, ``uint8``, ``bool``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ObservationRule:
    shape: tuple[int, ...]
    dtype: str

    def violation(self, key: str, tensor: torch.Tensor, batch_dims: int) -> str | None:
        shape = tuple(tensor.shape[batch_dims:])
        if shape != self.shape:
            return f"{key} has shape {list(shape)} per step; the env's observations are {list(self.shape)}"
        if _dtype_name(tensor.dtype) != self.dtype:
            return f"{key} is {_dtype_name(tensor.dtype)}; the env's observations are {self.dtype}"
        return None


@dataclass(frozen=True)
class ActionRule:
    """What an action must be: ``kind`` ``discrete`` (integers in ``[low, high]``, elementwise) or
    ``box`` (floats; in ``[low, high]`` when ``bounded``)."""

    kind: str
    shape: tuple[int, ...]
    low: torch.Tensor  # float64, broadcastable to ``shape``
    high: torch.Tensor
    space: str  # the space as gymnasium prints it, for reasons
    bounded: bool = True
    bools: bool = False  # MultiBinary: bool actions are its own values

    def violation(self, key: str, tensor: torch.Tensor, batch_dims: int) -> str | None:
        shape = tuple(tensor.shape[batch_dims:])
        allowed = {self.shape, (1,)} if self.kind == "discrete" and self.shape == () else {self.shape}
        if shape not in allowed:
            return f"{key} has shape {list(shape)} per step; {self.space} takes {list(self.shape)}"
        if self.kind == "discrete":
            if tensor.is_complex() or (tensor.dtype is torch.bool and not self.bools):
                return f"{key} is {_dtype_name(tensor.dtype)}; {self.space} takes integers"
            # Floats holding whole numbers are what some policies store (the env casts them, and
            # Categorical.log_prob takes them); a fraction would be stepped as one action and
            # trained as another.
            fractional = tensor != torch.round(tensor) if tensor.is_floating_point() else None
            if fractional is not None and bool(fractional.any()):
                example = tensor[fractional].reshape(-1)[0].item()
                return f"{key} holds non-integral values (e.g. {example}); {self.space} takes integers"
        elif not tensor.is_floating_point():
            return f"{key} is {_dtype_name(tensor.dtype)}; {self.space} takes floating-point actions"
        else:
            finite = torch.isfinite(tensor)
            if not bool(finite.all()):
                return f"{key} holds {int((~finite).sum())} non-finite values (NaN or Inf)"
        if not self.bounded or tensor.numel() == 0:
            return None
        values = tensor.reshape(-1, *self.shape).double()
        outside = (values < self.low) | (values > self.high)
        if bool(outside.any()):
            first = values[outside][0].item()
            shown = int(first) if self.kind == "discrete" else first
            return f"{key} holds {int(outside.sum())} values outside {self.space} (e.g. {shown})"
        return None


@dataclass(frozen=True)
class TrajectorySpaces:
    """The rules for a fragment's observations and actions (see the module docstring)."""

    observation: ObservationRule | None
    action: ActionRule | None

    @classmethod
    def of(cls, observation_space: Any, action_space: Any, *, action_bounds: bool) -> TrajectorySpaces:
        """From gymnasium spaces (duck-typed: ``data`` does not import the env layer)."""
        return cls(_observation_rule(observation_space), _action_rule(action_space, bounded=action_bounds))

    def violation(self, td: TensorDictBase) -> str | None:
        """Why ``td`` (a ``[num_envs, T]`` fragment) does not fit the spaces; None when it does."""
        batch_dims = len(td.batch_size)
        keys = set(td.keys())
        if self.observation is not None:
            for key in (OBSERVATION, NEXT_OBSERVATION):
                if key in keys and isinstance(tensor := td.get(key), torch.Tensor):
                    problem = self.observation.violation(key, tensor, batch_dims)
                    if problem is not None:
                        return problem
        if self.action is not None:
            if ACTION not in keys or not isinstance(action := td.get(ACTION), torch.Tensor):
                return f"a fragment needs an '{ACTION}' tensor for {self.action.space}"
            return self.action.violation(ACTION, action, batch_dims)
        return None


def _observation_rule(space: Any) -> ObservationRule | None:
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if shape is None or dtype is None or type(space).__name__ in {"Dict", "Tuple", "Graph", "Sequence"}:
        return None
    return ObservationRule(tuple(int(d) for d in shape), _dtype_name(np.dtype(dtype)))


def _bound(values: Any) -> torch.Tensor:
    return torch.tensor(np.array(values, dtype=np.float64))


def _action_rule(space: Any, *, bounded: bool) -> ActionRule | None:
    kind = type(space).__name__
    if kind == "Discrete":
        first = int(getattr(space, "start", 0))
        last = first + int(space.n) - 1
        return ActionRule(
            "discrete", (), _bound(first), _bound(last), f"Discrete({int(space.n)}) [{first}, {last}]"
        )
    if kind == "MultiDiscrete":
        nvec = np.asarray(space.nvec)
        starts = np.asarray(getattr(space, "start", np.zeros_like(nvec)))
        shape = tuple(int(d) for d in nvec.shape)
        return ActionRule(
            "discrete", shape, _bound(starts), _bound(starts + nvec - 1), f"MultiDiscrete({nvec.tolist()})"
        )
    if kind == "MultiBinary":
        shape = tuple(int(d) for d in space.shape)
        return ActionRule("discrete", shape, _bound(0), _bound(1), f"MultiBinary({list(shape)})", bools=True)
    if kind == "Box":
        shape = tuple(int(d) for d in space.shape)
        lows, highs = _bound(np.broadcast_to(space.low, shape)), _bound(np.broadcast_to(space.high, shape))
        return ActionRule("box", shape, lows, highs, f"Box{list(shape)}", bounded=bounded)
    return None

"""``spec.buffer.processors``: what RLightning's rollout buffer adds before a policy sees its data.

Pure (tensors in, tensors out). The train rank applies the job's processors in order to its
``[rows, T]`` share (rows are envs, columns steps) right before ``update_dataset``:

* ``GAE`` writes ``advantages`` and ``returns`` (``[rows, T]``) from ``reward``, ``terminated``,
  ``truncated`` and the values the policy returned while collecting (``valueKey``). The maths is
  the built-in PPO's own (:func:`rlkube.policy.builtin.ppo_math.gae`): the one-step bootstrap is
  cut where an episode terminated; where a row is cut without termination (a truncated episode,
  or the fragment's last step) it bootstraps from V(next_observation), which only the policy can
  give: its ``get_value(observations)``, called once per share with the next observations of
  every cut; within an episode V(next_observation_t) is the value collected at step t+1.
  ``bootstrap: none`` treats every cut as an episode end instead.
* ``Flatten`` turns ``[rows, T]`` into ``[rows * T]`` transitions, the shape RLightning's rollout
  buffer samples (a policy that minibatches with ``data[idx]`` then draws transitions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from rlkube.data.fragment import NEXT_OBSERVATION, REWARD, TERMINATED, TRUNCATED
from rlkube.policy.builtin.ppo_math import gae, normalize
from rlkube.spec import FlattenProcessor, GAEProcessor, ProcessorSpec

#: ``V(observations) -> [K]`` values for a batch of K observations (the policy's ``get_value``).
ValueFn = Callable[[torch.Tensor], torch.Tensor]

ADVANTAGES = "advantages"
RETURNS = "returns"


class ProcessorError(ValueError):
    """A processor cannot run on the data it was given; the message names the processor and the fix."""


def apply_processors(
    processors: Sequence[ProcessorSpec], data: TensorDict, *, value_fn: ValueFn | None = None
) -> TensorDict:
    """``data`` after every processor of ``processors``, in order (``data`` itself is not changed)."""
    for index, processor in enumerate(processors):
        where = f"spec.buffer.processors[{index}] ({processor.type})"
        if isinstance(processor, GAEProcessor):
            data = with_gae(data, processor, value_fn=value_fn, where=where)
        elif isinstance(processor, FlattenProcessor):
            data = flattened(data, where=where)
        else:  # a new processor type without a case here
            raise ProcessorError(f"{where}: no implementation")
    return data


def flattened(data: TensorDict, *, where: str = "Flatten") -> TensorDict:
    """``[rows, T]`` -> ``[rows * T]``; every key keeps its trailing shape."""
    if data.batch_dims != 2:
        raise ProcessorError(f"{where} needs [rows, T] fragments, got batch size {tuple(data.batch_size)}")
    return data.reshape(-1)


def with_gae(
    data: TensorDict, settings: GAEProcessor, *, value_fn: ValueFn | None = None, where: str = "GAE"
) -> TensorDict:
    """A copy of ``data`` with ``advantages`` and ``returns`` added; see the module docstring."""
    if data.batch_dims != 2:
        raise ProcessorError(f"{where} needs [rows, T] fragments, got batch size {tuple(data.batch_size)}")
    values = _values(data, settings.value_key, where=where)
    terminated = data[TERMINATED].bool()
    truncated = data[TRUNCATED].bool()
    cut = truncated.clone()
    cut[:, -1] = True  # the fragment ends: the next step is not in this row
    if settings.bootstrap == "none":
        terminated = terminated | cut
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    if settings.bootstrap == "policy":
        if value_fn is None:
            raise ProcessorError(
                f"{where} bootstraps cut rows from the policy's get_value(observations), and there is none "
                "here; define get_value on the policy or set bootstrap: none"
            )
        # Every cut, terminated ones too (gae ignores their value): the last step of every row is a
        # cut, so each train rank calls get_value exactly once per step, as DDP's collectives need.
        next_values[cut] = _bootstrap(value_fn, data[NEXT_OBSERVATION][cut], where=where)
    advantages, returns = gae(
        data[REWARD].float(),
        values,
        next_values,
        terminated,
        truncated & ~terminated,
        gamma=settings.gamma,
        gae_lambda=settings.gae_lambda,
    )
    out = data.clone(recurse=False)
    out[ADVANTAGES] = normalize(advantages) if settings.normalize else advantages
    out[RETURNS] = returns
    return out


def _values(data: TensorDict, key: str, *, where: str) -> torch.Tensor:
    if key not in data:
        present = ", ".join(sorted(str(k) for k in data.keys()))  # noqa: SIM118  (keys, not items)
        raise ProcessorError(
            f"{where} reads V(observation) from data[{key!r}], which the policy's responses do not hold "
            f"(keys: {present}); return it as PolicyResponse({key}=...) or set valueKey"
        )
    values = data[key].float()
    rows, steps = data.batch_size
    if values.numel() != rows * steps:
        raise ProcessorError(
            f"{where}: data[{key!r}] has shape {tuple(values.shape)}, "
            f"not one value per step ([{rows}, {steps}])"
        )
    return values.reshape(rows, steps).cpu()


def _bootstrap(value_fn: ValueFn, observations: torch.Tensor, *, where: str) -> torch.Tensor:
    with torch.no_grad():
        estimate: Any = value_fn(observations)
    if not isinstance(estimate, torch.Tensor) or estimate.numel() != observations.shape[0]:
        shape = tuple(estimate.shape) if isinstance(estimate, torch.Tensor) else type(estimate).__name__
        raise ProcessorError(
            f"{where}: get_value on {observations.shape[0]} next observations returned {shape}, "
            "not one value per observation"
        )
    return estimate.detach().float().reshape(-1).cpu()


def value_fn_of(policy: Any) -> ValueFn | None:
    """The policy's ``get_value`` fed on the policy's device, or None when it has none."""
    get_value = getattr(policy, "get_value", None)
    if not callable(get_value):
        return None
    device = getattr(policy, "device", "cpu")

    def value_fn(observations: torch.Tensor) -> torch.Tensor:
        return get_value(observations.to(device))

    return value_fn

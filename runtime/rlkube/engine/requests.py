"""Requests and responses of the rollout loop: checking what ``rollout_step`` returned, and assembling it.

Pure: no I/O. With per-env requests (RLightning's model, the default) every env's
:class:`PolicyResponse` is checked against its request and the fields of all envs are stacked
into one row per env: a tensor whose first dimension is 1 is taken as the request's batch of one
(the guide's ``observation.unsqueeze(0)``) and that dimension is dropped, python numbers become
0-d tensors, and ``action`` must hold exactly one env's action (it is reshaped to the action
space's shape). With batched requests the one response must already have a row per env. Either
way the result is an :class:`Acted`: the ``[N, ...]`` action for the env group and the fields
stored in the fragment. A response that fits neither raises :class:`RequestError`, naming the
mode, the shapes, and how to switch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlkube.envs.types import EnvRet, PolicyResponse

logger = logging.getLogger(__name__)

_SWITCH_TO_BATCHED = (
    "if rollout_step is written for every env of the group at once, declare "
    "`request_mode = RequestMode.BATCHED` on the class (from rlkube.policy.base import RequestMode)"
)
_SWITCH_TO_PER_ENV = (
    "return one row per env, or remove `request_mode = RequestMode.BATCHED` so rollout_step "
    "receives one env's EnvRet per call (RLightning's model)"
)


class RequestError(ValueError):
    """A ``rollout_step`` or ``postprocess`` result that does not fit the request it answers."""


@dataclass
class Acted:
    """One step's answers for every env: the action to step with and the fields to store."""

    action: torch.Tensor
    fields: dict[str, torch.Tensor]
    responses: Sequence[PolicyResponse] = ()  # per env (per-env requests) or the one batched response
    skipped: list[str] = field(default_factory=list)  # fields with no row per env (not stored)


def check_response(result: Any, *, policy: str, env_id: str | None, what: str) -> PolicyResponse:
    """``result`` as a PolicyResponse with an ``action``, or a RequestError saying what to return."""
    fix = (
        "return PolicyResponse(env_id=env_ret.env_id, action=..., ...) "
        "(from rlkube.types import PolicyResponse)"
    )
    if isinstance(result, Mapping):
        raise RequestError(f"{policy}.rollout_step returned a dict for {what}; {fix}")
    if not isinstance(result, PolicyResponse):
        raise RequestError(f"{policy}.rollout_step returned {type(result).__name__} for {what}; {fix}")
    if "action" not in result:
        raise RequestError(f"{policy}.rollout_step returned a PolicyResponse without 'action' for {what}")
    if env_id is not None:
        got = result.env_id
        if not isinstance(got, str | int) or str(got) != env_id:
            raise RequestError(
                f"{policy}.rollout_step answered the request of env {env_id!r} with env_id {got!r}; "
                "pass env_id=env_ret.env_id to PolicyResponse"
            )
    return result


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value)
    if isinstance(value, bool | int | float | np.number | np.bool_):
        return torch.as_tensor(value)
    return None


def one_env_value(value: Any) -> torch.Tensor | None:
    """A per-env field as one env's row: a leading batch of one is dropped; non-tensors give None."""
    tensor = _as_tensor(value)
    if tensor is None:
        return None
    if tensor.ndim >= 1 and tensor.shape[0] == 1:
        tensor = tensor[0]
    return tensor.detach()


def assemble_per_env(
    requests: Sequence[EnvRet],
    results: Sequence[Any],
    *,
    policy: str,
    mode: str,
    action_shape: tuple[int, ...],
    action_space: Any,
    reserved: Sequence[str],
) -> Acted:
    """Stack per-env responses into ``[N, ...]`` fields (see the module docstring)."""
    responses = [
        check_response(r, policy=policy, env_id=str(q.env_id), what=f"env {q.env_id!r}")
        for q, r in zip(requests, results, strict=True)
    ]
    numel = math.prod(action_shape)
    actions = []
    for request, response in zip(requests, responses, strict=True):
        action = _as_tensor(response.action)
        if action is None or action.numel() != numel:
            shape = tuple(action.shape) if action is not None else type(response.action).__name__
            raise RequestError(
                f"{mode}, one request per env: {policy}.rollout_step returned an action of shape {shape} "
                f"for env {request.env_id!r}, whose observation has shape "
                f"{tuple(getattr(request.observation, 'shape', ()))}; one env's action has "
                f"{numel} element(s) (shape {action_shape}, {action_space}). {_SWITCH_TO_BATCHED}"
            )
        actions.append(action.detach().reshape(action_shape))
    fields = stack_rows(
        [{k: v for k, v in r.items() if k not in ("env_id", "action")} for r in responses],
        source=f"{policy}.rollout_step",
        reserved=reserved,
    )
    action_batch = torch.stack(actions)
    fields["action"] = action_batch
    return Acted(action=action_batch, fields=fields, responses=responses)


def stack_rows(
    per_env: Sequence[Mapping[str, Any]], *, source: str, reserved: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Per-env dicts of one step -> ``{key: [N, ...]}``; every env must give the same keys and shapes."""
    if not per_env:
        return {}
    keys = list(per_env[0])
    for index, entry in enumerate(per_env):
        if list(entry) != keys:
            raise RequestError(
                f"{source} gave fields {sorted(entry)} for env {index} but {sorted(keys)} for env 0; "
                "every env's response must have the same fields"
            )
    stacked: dict[str, torch.Tensor] = {}
    for key in keys:
        if key in reserved:
            raise RequestError(f"{source} returned a field {key!r}, which the rollout loop writes itself")
        rows = [one_env_value(entry[key]) for entry in per_env]
        if any(row is None for row in rows):
            continue  # not a tensor or a number (e.g. a string): kept out of the fragment
        shapes = {tuple(row.shape) for row in rows if row is not None}
        if len(shapes) > 1:
            raise RequestError(f"{source} field {key!r} has different shapes across envs: {sorted(shapes)}")
        stacked[key] = torch.stack([row for row in rows if row is not None])
    return stacked


def assemble_batched(
    env_ret: EnvRet,
    result: Any,
    *,
    policy: str,
    mode: str,
    num_envs: int,
    reserved: Sequence[str],
    warn: Callable[[str, str], None],
) -> Acted:
    """Check a batched response (one row per env) and split out the action."""
    response = check_response(result, policy=policy, env_id=None, what=f"the batch of {num_envs} envs")
    action = _as_tensor(response.action)
    if action is None or action.ndim == 0 or action.shape[0] != num_envs:
        shape = tuple(action.shape) if action is not None else type(response.action).__name__
        raise RequestError(
            f"{mode}, batched requests: {policy}.rollout_step received all {num_envs} envs at once "
            f"(observation {tuple(getattr(env_ret.observation, 'shape', ()))}) and returned an action of "
            f"shape {shape}; it must have one row per env ({num_envs}, ...). {_SWITCH_TO_PER_ENV}"
        )
    fields = batched_rows(
        response.items(), source=f"{policy}.rollout_step", num_envs=num_envs, reserved=reserved, warn=warn
    )
    return Acted(action=action.detach(), fields=fields, responses=[response])


def batched_rows(
    items: Sequence[tuple[str, Any]] | Any,
    *,
    source: str,
    num_envs: int,
    reserved: Sequence[str],
    warn: Callable[[str, str], None],
) -> dict[str, torch.Tensor]:
    """Fields of a batched result that have one row per env (others are reported once and skipped)."""
    rows: dict[str, torch.Tensor] = {}
    for key, value in items:
        if key == "env_id":
            continue
        if key in reserved:
            raise RequestError(f"{source} returned a field {key!r}, which the rollout loop writes itself")
        tensor = _as_tensor(value)
        if tensor is None or tensor.ndim == 0 or tensor.shape[0] != num_envs:
            shape = tuple(tensor.shape) if tensor is not None else type(value).__name__
            warn(key, f"{source} field {key!r} ({shape}) has no row per env; not stored")
            continue
        rows[key] = tensor.detach()
    return rows

"""RLightning's ``rlightning.policy.utils.utils``: masked means and the Huber loss the losses use.

Pure: tensors in, tensors out. A ``mask`` is a bool tensor shaped like the values (``None``: all
valid); ``loss_mask_ratio`` scales each entry by the share of an episode's steps that are valid.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch


def huber_loss(error: torch.Tensor, delta: float) -> torch.Tensor:
    """Quadratic inside ``|error| < delta``, linear outside (continuous at the seam)."""
    magnitude = error.abs()
    return torch.where(magnitude < delta, 0.5 * error**2, delta * (magnitude - 0.5 * delta))


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None, axis: Any = None) -> torch.Tensor:
    """Mean over the valid entries; 0 when nothing is valid (never a division by zero)."""
    if mask is None:
        return values.mean() if axis is None else values.mean(dim=axis)
    total = (values * mask).sum() if axis is None else (values * mask).sum(dim=axis)
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return total / count.clamp(min=1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Any = None) -> torch.Tensor:
    """Sum over the valid entries."""
    return (values * mask).sum() if axis is None else (values * mask).sum(dim=axis)


def masked_mean_ratio(
    values: torch.Tensor, mask: torch.Tensor, loss_mask_ratio: torch.Tensor
) -> torch.Tensor:
    """Mean of ``values / loss_mask_ratio`` over every entry, invalid ones counted as 0."""
    return (values / loss_mask_ratio * mask).mean()


def seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum along ``dim`` within each sequence, then the mean over sequences."""
    return torch.sum(values * mask, dim=dim).mean()


def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Masked mean along ``dim`` within each sequence, then the mean over sequences."""
    return (torch.sum(values * mask, dim=dim) / torch.sum(mask, dim=dim).clamp(min=1)).mean()


def expand_to_target_dim(tensor: torch.Tensor | None, target_shape: torch.Size) -> torch.Tensor | None:
    """Append trailing axes of size 1 until ``tensor`` has as many axes as ``target_shape``."""
    if tensor is None:
        return None
    while tensor.dim() < len(target_shape):
        tensor = tensor.unsqueeze(-1)
    return tensor


def preprocess_loss_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    logprob_type: str | None = None,
    single_action_dim: int | None = None,
    loss_mask: torch.Tensor | None = None,
    loss_mask_sum: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    prev_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    reward_type: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Shape the loss inputs of chunked actions alike, then return them with ``kwargs``.

    ``reward_type="chunk_level"`` flattens the per-step tensors (advantages, masks, values,
    returns). Log-probabilities ``[B, chunks * action_dim]`` are read as ``[B, chunks, action_dim]``
    per token (``logprob_type="token_level"``: the advantages and masks gain an axis), summed over
    the action dims (``"action_level"``) or over the whole chunk (``"chunk_level"``). Every other
    tensor then gains trailing axes of 1 to broadcast against the log-probabilities.
    """
    if reward_type == "chunk_level":
        advantages = advantages.flatten()
        loss_mask, loss_mask_sum, values, prev_values, returns = (
            None if t is None else t.flatten()
            for t in (loss_mask, loss_mask_sum, values, prev_values, returns)
        )
    if logprob_type in ("token_level", "action_level", "chunk_level"):
        if single_action_dim is None:
            raise ValueError(f"logprob_type {logprob_type!r} needs single_action_dim")
        batch = logprobs.shape[0]
        logprobs = logprobs.reshape(batch, -1, single_action_dim)
        old_logprobs = old_logprobs.reshape(batch, -1, single_action_dim)
        if logprob_type == "token_level":
            advantages = advantages.unsqueeze(-1)
            loss_mask = None if loss_mask is None else loss_mask.unsqueeze(-1)
            loss_mask_sum = None if loss_mask_sum is None else loss_mask_sum.unsqueeze(-1)
        else:
            summed = -1 if logprob_type == "action_level" else [1, 2]
            logprobs, old_logprobs = logprobs.sum(dim=summed), old_logprobs.sum(dim=summed)
    target = logprobs.shape
    kwargs.update(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=expand_to_target_dim(advantages, target),
        loss_mask=expand_to_target_dim(loss_mask, target),
        loss_mask_sum=expand_to_target_dim(loss_mask_sum, target),
        values=expand_to_target_dim(values, target),
        prev_values=expand_to_target_dim(prev_values, target),
        returns=expand_to_target_dim(returns, target),
    )
    return kwargs


def postprocess_loss_metric(metrics_data: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Turn tensor figures into Python numbers, in place (for logging)."""
    for key, value in metrics_data.items():
        if isinstance(value, torch.Tensor):
            metrics_data[key] = value.detach().item()
    return metrics_data


def append_to_dict(data: MutableMapping[str, list[Any]], new_data: MutableMapping[str, Any]) -> None:
    """Append each figure of ``new_data`` to the list kept under its key in ``data``."""
    for key, value in new_data.items():
        data.setdefault(key, []).append(value)

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

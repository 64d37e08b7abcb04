"""Observation statistics as model state: a running mean and variance kept in module buffers.

Pure maths plus one ``nn.Module``. The buffers (``count``, ``mean``, ``var``) are part of the
policy's ``state_dict``, so they travel with every weight version through the weight plane, are
saved in checkpoints and restored on resume; an eval worker therefore normalises with exactly
the statistics of the version it acts with. Only the trainer changes them
(:meth:`RunningObsNorm.update_`), from the raw observations of the batch it just trained on,
merged over DDP ranks so every rank holds the same numbers. The merge is Chan et al.'s parallel
update, the one gymnasium's ``RunningMeanStd`` uses.
"""

from __future__ import annotations

import torch
from torch import nn


def merge_moments(
    count: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    batch_count: torch.Tensor,
    batch_mean: torch.Tensor,
    batch_var: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Moments of the union of two samples from each one's (count, mean, population var)."""
    total = count + batch_count
    delta = batch_mean - mean
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta.square() * count * batch_count / total
    return total, new_mean, m2 / total


class RunningObsNorm(nn.Module):
    """``forward(x) = clip((x - mean) / sqrt(var + eps), -clip, clip)`` over flat features."""

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, size: int, *, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.clip = clip
        self.epsilon = epsilon
        # float64: a count in the millions and small variances stay exact enough.
        self.register_buffer("count", torch.full((), 1e-4, dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = (self.var + self.epsilon).sqrt()
        out = (x.double() - self.mean) / scale
        return out.clamp(-self.clip, self.clip).float()

    @torch.no_grad()
    def update_(self, batch: torch.Tensor, *, world_size: int = 1) -> None:
        """Merge the moments of ``batch`` (``[n, size]`` raw features), summed over DDP ranks."""
        x = batch.reshape(batch.shape[0], -1).double()
        sums = torch.stack([x.sum(0), x.square().sum(0)])
        n = torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)
        if world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
            torch.distributed.all_reduce(n)
        if float(n) == 0.0:
            return
        batch_mean = sums[0] / n
        batch_var = (sums[1] / n - batch_mean.square()).clamp_min(0.0)
        count, mean, var = merge_moments(self.count, self.mean, self.var, n, batch_mean, batch_var)
        self.count.copy_(count)
        self.mean.copy_(mean)
        self.var.copy_(var)

"""SAC's maths in the papers' notation (Haarnoja et al. 2018, "SAC: Algorithms and Applications").

Pure: tensors in, tensors out; ``polyak_update_`` writes in place (trailing ``_``). Actions are
squashed: ``a = tanh(u)`` with ``u ~ N(mu, sigma)``, so the log-density of ``a`` carries the
change-of-variables term ``- sum log(1 - tanh(u)^2)`` (appendix C of the paper). ``alpha`` is the
temperature; the soft Bellman target bootstraps ``min(Q1', Q2') - alpha * log pi`` from the
target critics, and not at all where the episode terminated (a truncation still bootstraps).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributions import Normal

#: Keeps log(1 - tanh(u)^2) finite where tanh saturates (SB3 and CleanRL use the same epsilon).
SQUASH_EPS = 1e-6


def squashed_log_prob(normal: Normal, u: torch.Tensor) -> torch.Tensor:
    """``log pi(tanh(u))`` summed over action dimensions: ``[batch, act_dim] -> [batch]``."""
    return (normal.log_prob(u) - torch.log(1.0 - torch.tanh(u) ** 2 + SQUASH_EPS)).sum(-1)


def soft_td_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_log_prob: torch.Tensor,
    *,
    alpha: torch.Tensor | float,
    gamma: float,
) -> torch.Tensor:
    """``y = r + gamma (1 - terminated) (min(Q1', Q2')(s', a') - alpha log pi(a'|s'))``."""
    soft_value = torch.min(next_q1, next_q2) - alpha * next_log_prob
    return rewards.float() + gamma * (1.0 - terminated.float()) * soft_value


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``0.5 * (MSE(Q1, y) + MSE(Q2, y))`` (SB3's sum over the twin critics)."""
    return 0.5 * (((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean())


def actor_loss(
    log_prob: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, *, alpha: torch.Tensor | float
) -> torch.Tensor:
    """``E[alpha log pi(a|s) - min(Q1, Q2)(s, a)]`` with ``a`` reparameterised from pi."""
    return (alpha * log_prob - torch.min(q1, q2)).mean()


def temperature_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, *, target_entropy: float
) -> torch.Tensor:
    """``-E[log alpha (log pi + H_target)]``: alpha grows while the entropy is below its target."""
    return -(log_alpha * (log_prob.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak_update_(target: Iterable[torch.Tensor], source: Iterable[torch.Tensor], *, tau: float) -> None:
    """``theta' <- (1 - tau) theta' + tau theta``, in place."""
    for target_param, param in zip(target, source, strict=True):
        target_param.mul_(1.0 - tau).add_(param, alpha=tau)

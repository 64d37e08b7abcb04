"""PPO's maths in the paper's notation (Schulman et al. 2017; GAE: Schulman et al. 2016).

Pure: tensors in, tensors out, no state. Trajectories are ``[num_envs, T]`` (rows are envs,
columns time). Notation follows CleanRL's ``ppo.py``: ``delta`` is the TD error, ``lastgaelam``
the running advantage; ``values`` are V(observation_t) and ``next_values`` V(next_observation_t),
where next_observation is the true next observation (the episode's last frame where it ended).

The GAE trace is cut where an episode ended (terminated or truncated) and at the end of the
fragment; the one-step bootstrap is ``gamma * V(next_observation) * (1 - terminated)``, so a
truncated episode (time limit) still bootstraps from its last frame, and a terminated one does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    *,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns (``advantages + values``), both ``[num_envs, T]``."""
    if not rewards.shape == values.shape == next_values.shape == terminated.shape == truncated.shape:
        shapes = {
            "rewards": rewards,
            "values": values,
            "next_values": next_values,
            "terminated": terminated,
            "truncated": truncated,
        }
        listed = ", ".join(f"{name} {tuple(t.shape)}" for name, t in shapes.items())
        raise ValueError(f"gae needs equal [num_envs, T] shapes, got {listed}")
    rewards = rewards.float()
    values = values.float()
    next_values = next_values.float()
    not_terminated = 1.0 - terminated.float()
    continues = 1.0 - (terminated | truncated).float()  # does step t+1 belong to the same episode?
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[:, 0])  # the fragment end cuts the trace
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_values[:, t] * not_terminated[:, t] - values[:, t]
        lastgaelam = delta + gamma * gae_lambda * continues[:, t] * lastgaelam
        advantages[:, t] = lastgaelam
    return advantages, advantages + values


@dataclass(frozen=True)
class Surrogate:
    """The clipped surrogate loss and its diagnostics (``approx_kl`` and ``clipfrac`` carry no grad)."""

    loss: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


def clipped_surrogate(
    new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, *, clip_coef: float
) -> Surrogate:
    """``-min(r A, clip(r, 1-eps, 1+eps) A)``, averaged; ``r = exp(new - old)``."""
    logratio = new_log_prob - old_log_prob
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef)
    loss = torch.max(pg_loss1, pg_loss2).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - logratio).mean()  # the low-variance estimator (Schulman's blog)
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return Surrogate(loss=loss, approx_kl=approx_kl, clipfrac=clipfrac)


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    clip_coef: float,
    clip: bool,
    form: str = "max",
) -> torch.Tensor:
    """``0.5 * (V - R)^2``; with ``clip``, of V clipped around the old V.

    ``form="max"`` (CleanRL, OpenAI baselines) takes the larger of the clipped and unclipped losses,
    so a V pushed past the clip away from R is still pulled back; ``form="clipped"``
    (Stable-Baselines3's ``clip_range_vf``) takes the clipped loss alone: past the clip in either
    direction a sample gives no gradient.
    """
    unclipped = (new_values - returns) ** 2
    if not clip:
        return 0.5 * unclipped.mean()
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
    clipped = (clipped_values - returns) ** 2
    if form == "clipped":
        return 0.5 * clipped.mean()
    if form != "max":
        raise ValueError(f"value clipping form must be 'max' or 'clipped', got {form!r}")
    return 0.5 * torch.max(unclipped, clipped).mean()


def normalize(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit std (unchanged when there is a single element)."""
    if advantages.numel() < 2:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var(target - predicted) / Var(target)``; NaN when the target does not vary."""
    var_y = target.float().var()
    if var_y.item() == 0.0 or target.numel() < 2:
        return float("nan")
    return float(1.0 - (target.float() - predicted.float()).var() / var_y)

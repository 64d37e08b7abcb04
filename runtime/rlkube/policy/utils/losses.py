"""RLightning's ``rlightning.policy.utils.losses``: PPO's actor and critic losses with masks.

Pure. Same names, arguments and metric keys as RLightning's, in rlkube's notation: the actor loss
is the clipped surrogate (Schulman et al. 2017) with separate lower and upper clip ranges and an
optional dual clip (``c_clip``, Ye et al. 2020) for negative advantages; the critic loss is the
larger of the Huber losses of the value and of the value clipped around the old one. Every
average runs over the valid entries of ``loss_mask`` only (or, given ``max_episode_steps`` and
``loss_mask_sum``, weighs each entry by its episode's valid share).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlkube.policy.utils.utils import huber_loss, masked_mean, masked_mean_ratio

Metrics = dict[str, Any]


def _aggregation(
    loss_mask: torch.Tensor | None, max_episode_steps: int | None, loss_mask_sum: torch.Tensor | None
) -> tuple[Callable[..., torch.Tensor] | None, torch.Tensor | None]:
    """The episode-share weighting when all three are given, else None (plain masked mean)."""
    if max_episode_steps is not None and loss_mask_sum is not None and loss_mask is not None:
        return masked_mean_ratio, loss_mask_sum.float() / max_episode_steps
    return None, None


def compute_ppo_actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    c_clip: float | None = None,
    loss_agg_func: Callable[..., torch.Tensor] | None = masked_mean,
    max_episode_steps: int | None = None,
    loss_mask_sum: torch.Tensor | None = None,
    critic_warmup: bool | None = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, Metrics]:
    """``-min(r A, clip(r, 1 - low, 1 + high) A)`` averaged, and its diagnostics under ``actor/``."""
    for name, tensor in (("logprobs", logprobs), ("old_logprobs", old_logprobs), ("advantages", advantages)):
        if tensor.dtype != torch.float32:
            raise TypeError(f"compute_ppo_actor_loss: {name} must be float32, got {tensor.dtype}")
    ratio_agg, loss_mask_ratio = _aggregation(loss_mask, max_episode_steps, loss_mask_sum)
    aggregate = ratio_agg or loss_agg_func or masked_mean
    valid = torch.ones_like(logprobs, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    count = valid.count_nonzero().clamp(min=1)

    logratio = logprobs - old_logprobs
    ratio = torch.where(valid, logratio.exp(), torch.zeros_like(logratio))
    clipped_ratio = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * clipped_ratio
    per_entry = torch.max(unclipped_loss, clipped_loss)
    if c_clip is not None:
        if c_clip <= 1.0:
            raise ValueError(f"c_clip (the dual clip) must be above 1, got {c_clip}")
        dual_bound = advantages.sign() * c_clip * advantages
        dual_clipped = (dual_bound.detach() < per_entry.detach()) & valid
        per_entry = torch.min(per_entry, dual_bound)
    else:
        dual_clipped = torch.zeros_like(valid)

    if aggregate is masked_mean_ratio:
        policy_loss = masked_mean_ratio(per_entry, valid, loss_mask_ratio)  # type: ignore[arg-type]
    else:
        policy_loss = aggregate(per_entry, loss_mask)
    if critic_warmup:
        policy_loss = torch.zeros((), device=policy_loss.device)

    with torch.no_grad():
        clip_fraction = ((unclipped_loss < clipped_loss) & valid).count_nonzero() / count
        approx_kl = torch.where(valid, -logratio, torch.zeros_like(logratio)).sum() / count
        metrics = {
            "actor/policy_loss": policy_loss.detach(),
            "actor/ratio": masked_mean(ratio, loss_mask),
            "actor/clipped_ratio": masked_mean(clipped_ratio, loss_mask),
            "actor/dual_cliped_ratio": masked_mean(
                torch.where(dual_clipped, ratio, torch.zeros_like(ratio)), loss_mask
            ),
            "actor/approx_kl": approx_kl,
            "actor/clip_fraction": clip_fraction,
        }
    return policy_loss, metrics


def compute_ppo_critic_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    prev_values: torch.Tensor,
    value_clip: float,
    huber_delta: float,
    loss_mask: torch.Tensor | None = None,
    max_episode_steps: int | None = None,
    loss_mask_sum: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Metrics]:
    """``max(huber(R - V), huber(R - V_clip))`` averaged; ``V_clip`` is within ``value_clip`` of old V."""
    ratio_agg, loss_mask_ratio = _aggregation(loss_mask, max_episode_steps, loss_mask_sum)
    clipped_values = prev_values + (values - prev_values).clamp(-value_clip, value_clip)
    per_entry = torch.max(
        huber_loss(returns - values, huber_delta), huber_loss(returns - clipped_values, huber_delta)
    )
    if ratio_agg is not None and loss_mask is not None:
        value_loss = masked_mean_ratio(per_entry, loss_mask, loss_mask_ratio)  # type: ignore[arg-type]
    else:
        value_loss = masked_mean(per_entry, loss_mask)
    with torch.no_grad():
        clipped_share = ((values - prev_values).abs() > value_clip).float().mean()
    metrics = {
        "critic/value_loss": float(value_loss.detach().item()),
        "critic/value_clip_ratio": float(clipped_share.item()),
    }
    return value_loss, metrics


def compute_ppo_actor_critic_loss(**kwargs: Any) -> tuple[torch.Tensor, Metrics]:
    """The actor loss plus the critic loss; both take what they need from the same keyword arguments."""
    actor_loss, actor_metrics = compute_ppo_actor_loss(**kwargs)
    critic_loss, critic_metrics = compute_ppo_critic_loss(**kwargs)
    return actor_loss + critic_loss, {**actor_metrics, **critic_metrics}

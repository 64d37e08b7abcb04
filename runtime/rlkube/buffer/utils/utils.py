"""RLightning's ``rlightning.buffer.utils.utils`` GAE helpers, on the built-in PPO's GAE. Pure.

RLightning's helpers take time-major ``[T, num_envs]`` tensors and one ``dones`` flag per step
that both stops the bootstrap and cuts the trace; they return ``(advantages, returns)`` with
``returns = advantages + values`` (before normalising the advantages). Both names compute the
same thing here: :func:`rlkube.policy.builtin.ppo_math.gae` on the transposed tensors.
"""

from __future__ import annotations

import torch

from rlkube.policy.builtin.ppo_math import gae, normalize


def default_compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
    normalize_adv: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over ``[T, num_envs]`` tensors; ``dones`` ends the episode (no bootstrap past it)."""
    if rewards.dim() != 2:
        raise ValueError(
            f"default_compute_gae takes [T, num_envs] tensors, got rewards {tuple(rewards.shape)}"
        )
    ended = dones.bool().T
    advantages, returns = gae(
        rewards.T,
        values.T,
        next_values.T,
        ended,
        torch.zeros_like(ended),
        gamma=gamma,
        gae_lambda=lam,
    )
    advantages, returns = advantages.T.contiguous(), returns.T.contiguous()
    return (normalize(advantages) if normalize_adv else advantages), returns


#: RLightning's loop-free variant; the results are the same, so is the function.
default_gae_no_loop = default_compute_gae

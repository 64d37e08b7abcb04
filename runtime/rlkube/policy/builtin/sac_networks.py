"""The built-in SAC's networks: a squashed-Gaussian actor, twin Q critics and their targets.

Pure (no I/O). One module (``SACNetworks``) holds them all, the temperature ``log_alpha``
included, so a weight version and a checkpoint carry the whole learner state. The actor works in
the squashed space ``[-1, 1]``; :meth:`SACNetworks.to_env` and :meth:`SACNetworks.from_env` map
to and from the Box's ``[low, high]`` (transitions hold the env's action).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Normal

from rlkube.policy.builtin.actor_critic import mlp
from rlkube.policy.builtin.sac_math import squashed_log_prob

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}

#: The actor's log std is clamped to this range (SB3 and CleanRL).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class TwinQ(nn.Module):
    """``Q1(s, a), Q2(s, a)``: two independent MLPs over the concatenated observation and action."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], activation: str) -> None:
        super().__init__()
        self.q1 = mlp(obs_dim + act_dim, hidden, 1, activation=activation, out_gain=1.0, ortho=False)
        self.q2 = mlp(obs_dim + act_dim, hidden, 1, activation=activation, out_gain=1.0, ortho=False)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class SACNetworks(nn.Module):
    """Actor, critics, target critics and the temperature of one SAC learner."""

    action_center: torch.Tensor
    action_half_range: torch.Tensor

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        hidden_sizes: Sequence[int],
        activation: str,
        init_alpha: float,
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box) or not np.all(np.isfinite(action_space.low)):
            raise ValueError(
                f"SAC needs a bounded Box action space (continuous actions); the env has {action_space}"
            )
        obs_dim = int(np.prod(observation_space.shape or (1,)))
        self.action_shape = tuple(action_space.shape)
        act_dim = int(np.prod(self.action_shape))
        layers: list[nn.Module] = []
        width = obs_dim
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
            width = size
        self.trunk = nn.Sequential(*layers)
        self.mu = nn.Linear(width, act_dim)
        self.log_std = nn.Linear(width, act_dim)
        self.critic = TwinQ(obs_dim, act_dim, hidden_sizes, activation)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(init_alpha))))
        low = torch.as_tensor(action_space.low, dtype=torch.float32).reshape(-1)
        high = torch.as_tensor(action_space.high, dtype=torch.float32).reshape(-1)
        self.register_buffer("action_center", (high + low) / 2.0)
        self.register_buffer("action_half_range", (high - low) / 2.0)

    @staticmethod
    def flatten(obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).float()

    def policy(self, obs: torch.Tensor) -> Normal:
        """pi(u | s) before squashing."""
        x = self.trunk(self.flatten(obs))
        log_std = torch.clamp(self.log_std(x), LOG_STD_MIN, LOG_STD_MAX)
        return Normal(self.mu(x), log_std.exp(), validate_args=False)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised squashed action in ``[-1, 1]`` and its log-probability."""
        normal = self.policy(obs)
        u = normal.rsample()
        return torch.tanh(u), squashed_log_prob(normal, u)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.policy(obs).mean)

    def to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        action = self.action_center + self.action_half_range * squashed
        return action.reshape(squashed.shape[0], *self.action_shape)

    def from_env(self, action: torch.Tensor) -> torch.Tensor:
        flat = action.reshape(action.shape[0], -1).float()
        return ((flat - self.action_center) / self.action_half_range).clamp(-1.0, 1.0)

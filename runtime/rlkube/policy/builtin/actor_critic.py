"""The built-in PPO's network: separate MLP actor and critic, or a shared NatureCNN trunk.

Pure (no I/O). ``encoder="mlp"``: separate actor and critic MLPs over the flattened observation,
optionally normalised by running statistics kept in buffers (``obs_norm``, see
``running_stats``). ``encoder="nature_cnn"``: one Nature-DQN trunk shared by a linear actor and
a linear critic head (CleanRL's ``ppo_atari.py``); images arrive as the env made them (uint8,
HWC or CHW, stacked or not) and are converted inside ``forward``. Discrete action spaces get a
Categorical head; Box action spaces a diagonal Gaussian whose log std is a state-independent
parameter. ``forward`` returns everything PPO needs in one call, so DDP's gradient hooks see
every parameter used through the wrapper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from rlkube.policy.builtin.encoders import ImageLayout, NatureCNN
from rlkube.policy.builtin.running_stats import RunningObsNorm

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}


def _layer(n_in: int, n_out: int, *, gain: float, ortho: bool) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    if ortho:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.constant_(layer.bias, 0.0)
    return layer


def mlp(
    n_in: int, hidden: Sequence[int], n_out: int, *, activation: str, out_gain: float, ortho: bool
) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for size in hidden:
        layers += [_layer(width, size, gain=math.sqrt(2), ortho=ortho), _ACTIVATIONS[activation]()]
        width = size
    layers.append(_layer(width, n_out, gain=out_gain, ortho=ortho))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """``forward(obs, action=None, deterministic=False) -> (action, log_prob, entropy, value)``."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
        ortho_init: bool = True,
        encoder: str = "mlp",
        image_layout: ImageLayout = "auto",
        normalize_observation: bool = False,
        observation_clip: float = 10.0,
    ) -> None:
        super().__init__()
        if observation_space.shape is None:
            raise ValueError(f"PPO needs an observation space with a shape, got {observation_space}")
        obs_dim = int(np.prod(observation_space.shape))
        if isinstance(action_space, gym.spaces.Discrete):
            self.discrete = True
            out_dim = int(action_space.n)
            self.action_shape: tuple[int, ...] = ()
        elif isinstance(action_space, gym.spaces.Box):
            self.discrete = False
            self.action_shape = tuple(action_space.shape)
            out_dim = int(np.prod(self.action_shape))
        else:
            raise ValueError(
                f"the built-in PPO supports Discrete and Box action spaces, got {type(action_space).__name__}"
            )
        self.obs_norm: RunningObsNorm | None = None
        self.encoder: NatureCNN | None = None
        if encoder == "nature_cnn":
            if normalize_observation:
                raise ValueError(
                    "normalizeObservation applies to the mlp encoder (images are scaled by 1/255)"
                )
            self.encoder = NatureCNN(tuple(observation_space.shape), image_layout)
            self.critic: nn.Module = _layer(self.encoder.features, 1, gain=1.0, ortho=True)
            self.actor: nn.Module = _layer(self.encoder.features, out_dim, gain=0.01, ortho=True)
        elif encoder == "mlp":
            if normalize_observation:
                self.obs_norm = RunningObsNorm(obs_dim, clip=observation_clip)
            self.critic = mlp(obs_dim, hidden_sizes, 1, activation=activation, out_gain=1.0, ortho=ortho_init)
            self.actor = mlp(
                obs_dim, hidden_sizes, out_dim, activation=activation, out_gain=0.01, ortho=ortho_init
            )
        else:
            raise ValueError(f"unknown encoder {encoder!r} (mlp, nature_cnn)")
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(init_log_std)))

    @staticmethod
    def flatten(obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).float()

    def features(self, obs: torch.Tensor, *, normalized: bool = False) -> torch.Tensor:
        """What the heads see: CNN features, or the (normalised) flattened observation.

        ``normalized``: ``obs`` is already the output of ``obs_norm`` (normalised when it was
        collected, ``observationStats: perStep``) and is used as it is.
        """
        if self.encoder is not None:
            return self.encoder(obs)
        if self.obs_norm is not None and not normalized:
            return self.obs_norm(obs.reshape(obs.shape[0], -1))
        return self.flatten(obs)

    def value(self, obs: torch.Tensor, *, normalized: bool = False) -> torch.Tensor:
        return self.critic(self.features(obs, normalized=normalized)).squeeze(-1)

    def distribution(self, x: torch.Tensor) -> Categorical | Normal:
        out = self.actor(x)
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor | None = None,
        deterministic: bool = False,
        normalized: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.features(obs, normalized=normalized)
        dist = self.distribution(x)
        if action is None:
            if deterministic:
                action = dist.probs.argmax(-1) if isinstance(dist, Categorical) else dist.mean
            else:
                action = dist.sample()
        if self.discrete:
            log_prob, entropy = dist.log_prob(action), dist.entropy()
            out_action = action
        else:
            flat = action.reshape(action.shape[0], -1)
            log_prob, entropy = dist.log_prob(flat).sum(-1), dist.entropy().sum(-1)
            out_action = flat.reshape(action.shape[0], *self.action_shape)
        return out_action, log_prob, entropy, self.critic(x).squeeze(-1)

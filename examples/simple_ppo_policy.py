"""RLightning's shipped ``SimplePPOPolicy``, ported: the same imports (``rlkube`` for ``rlightning``),
the same calls, the same config reads, the same device handling.

What it shows a user porting RLightning's own policies:

* ``NatureCNN(image_format="HWC")`` and its ``out_feature_dim`` come from ``rlkube.models.vision``;
  ``get_logger`` from ``rlkube.utils.logger``; ``@profiler.timer_wrap`` from ``rlkube.utils.profiler``.
* ``self.config.train_config.<field>`` is ``spec.policy.trainConfig`` of the RLJob.
* ``train`` reads ``data["advantages"]`` and ``data["returns"]``, which the job asks the buffer for
  (``spec.buffer.processors: [{type: GAE}, {type: Flatten}]``), so ``postprocess`` stays
  unimplemented, as in RLightning.
* As in RLightning, ``evaluate``, ``update_dataset`` and ``rollout_step`` put tensors on CUDA
  unconditionally: this class needs a GPU (``examples/simple_ppo.yaml``).
  ``tests/porting/simple_ppo_cpu.py`` runs the same class on CPU with only those three moves
  pointed at ``self.device``.
* RLightning's version also imports ``ray`` to unwrap an action space that arrives as a Ray object
  ref; rlkube hands ``env_meta`` over as a value, so that import and check are gone.
"""

from __future__ import annotations

import functools
import operator
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from gymnasium import spaces as gym_spaces
from rlkube.models.vision import NatureCNN
from rlkube.policy.base_policy import BasePolicy
from rlkube.types import EnvRet, PolicyResponse
from rlkube.utils.logger import get_logger
from rlkube.utils.profiler import profiler
from rlkube.utils.registry import POLICIES
from tensordict import TensorDict
from torch.distributions import Normal
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import AdamW

logger = get_logger(__name__)


@POLICIES.register("SimplePPOPolicy")
class SimplePPOPolicy(BasePolicy):
    """Actor-critic PPO over a NatureCNN trunk; discrete or flattened Box actions."""

    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        action_space = env_meta.action_space
        self.is_discrete_action = isinstance(action_space, gym_spaces.Discrete)
        if self.is_discrete_action:
            action_dim = int(action_space.n)
        elif isinstance(action_space, gym_spaces.Box):
            action_dim = functools.reduce(operator.mul, action_space.shape)
        else:
            raise RuntimeError(f"unsupported action space! {type(action_space)}")

        self.encoder = NatureCNN(image_format="HWC")
        self.actor_mean = nn.Linear(self.encoder.out_feature_dim, action_dim)
        self.critic = nn.Linear(self.encoder.out_feature_dim, 1)
        self.actor_logstd = (
            None if self.is_discrete_action else nn.Parameter(torch.full((1, action_dim), -0.5))
        )

        if torch.cuda.is_available():
            self.encoder.cuda()
            self.actor_mean.cuda()
            self.critic.cuda()
            if self.actor_logstd is not None:
                self.actor_logstd.cuda()

    def setup_optimizer(self, optim_cfg: Any) -> None:
        parameters = [*self.encoder.parameters(), *self.actor_mean.parameters(), *self.critic.parameters()]
        if self.actor_logstd is not None:
            parameters.append(self.actor_logstd)
        self.optimizer = AdamW(parameters, lr=optim_cfg.lr)

    def _distribution(self, features: torch.Tensor) -> torch.distributions.Distribution:
        if self.is_discrete_action:
            return torch.distributions.Categorical(logits=self.actor_mean(features))
        mean = self.actor_mean(features)
        return Normal(mean, self.actor_logstd.exp().expand_as(mean))  # type: ignore[union-attr]

    def _log_prob_and_entropy(
        self, dist: torch.distributions.Distribution, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_discrete_action:
            return dist.log_prob(action), dist.entropy()
        return dist.log_prob(action).sum(-1), dist.entropy().sum(-1)

    def get_action(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if obs.dim() == 3:
            obs = obs.unsqueeze(0)
        dist = self._distribution(self.encoder(obs))
        action = dist.sample()
        logprob, entropy = self._log_prob_and_entropy(dist, action)
        return action, logprob, entropy

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) for a batch of observations, ``[B]``."""
        return self.critic(self.encoder(obs)).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        obs, action = obs.cuda(), action.cuda()
        return self.evaluate_on_device(obs, action)

    def evaluate_on_device(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of ``action``, entropy and V for a batch already on the model's device."""
        features = self.encoder(obs)
        log_prob, entropy = self._log_prob_and_entropy(self._distribution(features), action)
        return log_prob, entropy, self.critic(features).squeeze(-1)

    def get_action_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        action, logp, ent = self.get_action(obs)
        return action, logp, ent, self.get_value(obs)

    def postprocess(self, data: Any) -> Any:  # type: ignore[override]  # never called, as in RLightning
        raise NotImplementedError

    def update_dataset(self, data: Any) -> None:
        """Keep this rank's batch (transitions with advantages and returns) on the GPU."""
        self.data = TensorDict.from_dict(data, auto_batch_size=True, device="cuda")

    @profiler.timer_wrap(level="info")
    def train(self) -> None:  # type: ignore[override]  # RLightning's train() is the training step
        data = self.data
        train_config = self.config.train_config
        ppo_epochs = train_config.ppo_epochs
        minibatch_size = train_config.minibatch_size
        clip_coef = train_config.clip_ratio
        entropy_coef = train_config.entropy_coef
        batch_size = len(data)
        for _ in range(ppo_epochs):
            order = torch.randperm(batch_size)
            for start in range(0, batch_size, minibatch_size):
                mb = order[start : start + minibatch_size]
                mb_advantages = data["advantages"][mb]
                logprobs, entropy, values = self.evaluate(data["observation"][mb], data["action"][mb])
                ratio = torch.exp(logprobs - data["log_prob"][mb])
                surrogate = -mb_advantages * ratio
                clipped = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
                policy_loss = torch.max(surrogate, clipped).mean()
                value_loss = F.mse_loss(values, data["returns"][mb])
                entropy_loss = -entropy.mean()
                loss = policy_loss + 0.5 * value_loss + entropy_coef * entropy_loss

                self.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm=2.0)
                self.optimizer.step()

    @profiler.timer_wrap(level="debug")
    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        obs_tensor = env_ret.observation.float().unsqueeze(0).cuda()
        action, log_prob, entropy, value = self.get_action_value(obs_tensor)
        return PolicyResponse(
            env_id=env_ret.env_id, action=action, log_prob=log_prob, entropy=entropy, value=value
        )

    def get_trainable_parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        return {
            name: (model.module if isinstance(model, DDP) else model).state_dict()
            for name, model in self.model_list
        }

    def load_state_dict(
        self, state_dict: Any, strict: bool = True, assign: bool = False, *args: Any, **kwargs: Any
    ) -> None:
        for name, model in self.model_list:
            model.load_state_dict(state_dict[name], strict=strict)

    def save_weights(self, save_dir: str, epoch: int) -> None:
        """RLightning's weight file ``<save_dir>/epoch_<n>/simple_ppo.pt`` (rlkube checkpoints by itself)."""
        target = Path(save_dir) / f"epoch_{epoch}"
        os.makedirs(target, exist_ok=True)
        state: dict[str, Any] = {
            name: (model.module if isinstance(model, DDP) else model).state_dict()
            for name, model in self.model_list
        }
        if self.actor_logstd is not None:
            state["actor_logstd"] = self.actor_logstd.detach().cpu()
        if getattr(self, "optimizer", None) is not None:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, target / "simple_ppo.pt")

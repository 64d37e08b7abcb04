"""The built-in ``SAC`` policy (``spec.policy.type: SAC``): soft actor-critic on rlkube's BasePolicy.

Off-policy, continuous actions (a bounded Box), with ``buffer.type: replay``: eval workers act
with the actor (a sampled squashed Gaussian; greedy: its mean), every transition lands in each
train rank's replay ring, and each epoch a rank samples ``replay_sample_size`` transitions, that
is ``round(updatesPerStep * stepsPerEpoch)`` minibatches of ``batchSize // ranks`` drawn uniformly
with replacement (the same as one draw per gradient step). ``train`` then takes one gradient step
per minibatch, in SB3's order: temperature, critics, actor, then a Polyak step of the target
critics. On several ranks the gradients are averaged by all-reduce (the networks are not
DDP-wrapped: SAC calls its sub-networks directly, which DDP's hooks would not see).

Metrics: ``losses/qf_loss``, ``losses/actor_loss``, ``losses/alpha_loss`` (means over the update),
``losses/qf_values`` (mean Q of the sampled transitions), ``charts/alpha``, ``charts/gradient_steps``.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from tensordict import TensorDict

from rlkube.data.fragment import NEXT_OBSERVATION, OBSERVATION, REWARD, TERMINATED
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.base import BasePolicy, PolicyRole, RequestMode, unwrap
from rlkube.policy.builtin.ppo_config import parse_section
from rlkube.policy.builtin.sac_config import SACAlgoConfig, SACModelConfig, SACOptimConfig
from rlkube.policy.builtin.sac_math import (
    actor_loss,
    critic_loss,
    polyak_update_,
    soft_td_target,
    temperature_loss,
)
from rlkube.policy.builtin.sac_networks import SACNetworks
from rlkube.policy.registry import POLICIES
from rlkube.spec import BufferType


@POLICIES.register("SAC")
class SAC(BasePolicy):
    """Soft actor-critic with twin critics, target critics and a learned temperature."""

    request_mode = RequestMode.BATCHED
    supported_buffers = frozenset({BufferType.REPLAY})

    def __init__(self, config: Any, role_type: PolicyRole | str) -> None:
        super().__init__(config, role_type)
        self.algo = parse_section(SACAlgoConfig, config.algo_cfg, path="spec.policy.algoCfg")
        self.optim_settings = parse_section(SACOptimConfig, config.optim_cfg, path="spec.policy.optimCfg")
        self.arch = parse_section(SACModelConfig, config.model_cfg, path="spec.policy.modelCfg")
        self.actor_optimizer: torch.optim.Optimizer | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.alpha_optimizer: torch.optim.Optimizer | None = None
        self.target_entropy = 0.0

    # ------------------------------------------------------------------ network and optimizers
    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        self.model = SACNetworks(
            env_meta.observation_space,
            env_meta.action_space,
            hidden_sizes=self.arch.hidden_sizes,
            activation=self.arch.activation,
            init_alpha=self.algo.init_alpha,
        ).to(self.device)
        action_dims = math.prod(env_meta.action_space.shape)
        self.target_entropy = (
            -float(action_dims) if self.algo.target_entropy is None else self.algo.target_entropy
        )

    def wrap_with_ddp(self, gpu_id: int, process_group: Any) -> None:
        """Not wrapped: ``train`` all-reduces the gradients itself (see the module docstring)."""

    def setup_optimizer(self, optim_cfg: Any) -> None:
        nets = self.networks
        lr = self.optim_settings.lr
        actor_params = [*nets.trunk.parameters(), *nets.mu.parameters(), *nets.log_std.parameters()]
        self.actor_optimizer = torch.optim.Adam(actor_params, lr=lr)
        self.critic_optimizer = torch.optim.Adam(nets.critic.parameters(), lr=lr)
        self.alpha_optimizer = torch.optim.Adam([nets.log_alpha], lr=lr)

    @property
    def networks(self) -> SACNetworks:
        return cast(SACNetworks, unwrap(self.model))

    # ------------------------------------------------------------------ rollout (EVAL)
    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        nets = self.networks
        obs = torch.as_tensor(env_ret.observation, device=self.device)
        squashed = nets.greedy(obs) if deterministic else nets.sample(obs)[0]
        return PolicyResponse(env_id=env_ret.env_id, action=nets.to_env(squashed))

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        return None

    # ------------------------------------------------------------------ training (TRAIN)
    def minibatch_size(self) -> int:
        """This rank's minibatch: the global ``spec.train.batchSize`` split over the ranks."""
        global_batch = int(getattr(getattr(self, "train_config", None), "batch_size", 256))
        return max(1, global_batch // max(1, getattr(self, "world_size", 1)))

    def gradient_steps(self, steps_per_epoch: int) -> int:
        return max(1, round(self.algo.updates_per_step * steps_per_epoch))

    def replay_sample_size(self, steps_per_epoch: int, world_size: int) -> int:
        """Transitions this rank samples per epoch: one minibatch per gradient step."""
        return self.gradient_steps(steps_per_epoch) * max(1, int(self.minibatch_size()))

    def update_dataset(self, data: TensorDict) -> None:
        data = data.reshape(-1) if data.batch_dims != 1 else data
        self.dataset = data.to(self.device)

    def train(self, *args: Any, **kwargs: Any) -> dict[str, float]:  # type: ignore[override]  # RLightning's train()
        if (
            self.dataset is None
            or self.actor_optimizer is None
            or self.critic_optimizer is None
            or self.alpha_optimizer is None
        ):
            raise RuntimeError("SAC.train needs init_train() and update_dataset() first")
        nets = self.networks
        b = self.dataset
        mb_size = min(self.minibatch_size(), len(b))
        names = ("qf_loss", "actor_loss", "alpha_loss", "qf_values")
        sums = {name: torch.zeros((), device=b.device) for name in names}
        steps = 0
        for start in range(0, len(b) - mb_size + 1, mb_size):
            mb = b[start : start + mb_size]
            obs, next_obs = mb[OBSERVATION], mb[NEXT_OBSERVATION]
            actions = nets.from_env(mb["action"])
            # Temperature first, with the actions the current actor takes (SB3's order).
            new_actions, log_prob = nets.sample(obs)
            alpha = nets.log_alpha.exp().detach()
            a_loss = temperature_loss(nets.log_alpha, log_prob, target_entropy=self.target_entropy)
            if self.algo.learn_alpha:
                self._step(self.alpha_optimizer, a_loss, [nets.log_alpha])
                alpha = nets.log_alpha.exp().detach()
            with torch.no_grad():
                next_actions, next_log_prob = nets.sample(next_obs)
                next_q1, next_q2 = nets.critic_target(nets.flatten(next_obs), next_actions)
                target = soft_td_target(
                    mb[REWARD],
                    mb[TERMINATED],
                    next_q1,
                    next_q2,
                    next_log_prob,
                    alpha=alpha,
                    gamma=self.algo.gamma,
                )
            q1, q2 = nets.critic(nets.flatten(obs), actions)
            qf_loss = critic_loss(q1, q2, target)
            self._step(self.critic_optimizer, qf_loss, list(nets.critic.parameters()))
            pi_q1, pi_q2 = nets.critic(nets.flatten(obs), new_actions)
            pi_loss = actor_loss(log_prob, pi_q1, pi_q2, alpha=alpha)
            actor_params = [p for group in self.actor_optimizer.param_groups for p in group["params"]]
            self._step(self.actor_optimizer, pi_loss, actor_params)
            polyak_update_(nets.critic_target.parameters(), nets.critic.parameters(), tau=self.algo.tau)
            steps += 1
            for name, value in zip(names, (qf_loss, pi_loss, a_loss, q1.mean()), strict=True):
                sums[name] += value.detach()
        metrics = {f"losses/{key}": float(value) / max(steps, 1) for key, value in sums.items()}
        metrics["charts/alpha"] = float(nets.log_alpha.detach().exp())
        metrics["charts/gradient_steps"] = float(steps)
        for key, value in metrics.items():
            self.log_metric(key, value)
        return metrics

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: list[torch.Tensor]) -> None:
        """Backward, average ``params``' gradients over the ranks, step ``optimizer``."""
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.world_size > 1 and torch.distributed.is_initialized():
            for param in params:
                if param.grad is not None:
                    torch.distributed.all_reduce(param.grad)
                    param.grad /= self.world_size
        optimizer.step()

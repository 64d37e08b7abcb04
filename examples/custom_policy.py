"""A policy written to RLightning's "Customize Policy" guide, running on rlkube.

Porting it was a change of imports (``rlightning`` -> ``rlkube``); see
docs/porting-from-rlightning.md. As in RLightning, ``rollout_step`` receives one env's EnvRet (its
observation has no batch dimension, hence the guide's ``unsqueeze(0)``) and answers for that env.
Two things differ from the guide's snippets on purpose: an MLP encoder stands in for NatureCNN
(CartPole observations are vectors, and its actions are discrete: ``action_space.n``), and tensors
go to ``self.device`` instead of ``.cuda()``, so the same file runs on CPU and GPU.

Run it:  rlkube run examples/custom_policy.yaml
"""

import torch
from rlkube.policy import BasePolicy
from rlkube.types import EnvRet, PolicyResponse
from rlkube.utils.registry import POLICIES
from torch import nn
from torch.distributions import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP


class MLPEncoder(nn.Module):
    """Stands in for the guide's NatureCNN: observation vector -> features."""

    def __init__(self, obs_dim, hidden_dim):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, hidden_dim), nn.Tanh()
        )
        self.out_feature_dim = hidden_dim

    def forward(self, obs):
        return self.net(obs)


@POLICIES.register("MyPolicy")
class MyPolicy(BasePolicy):
    # --- Network & optimizer ---
    def construct_network(self, env_meta, *args, **kwargs):
        obs_dim = env_meta.observation_space.shape[0]
        action_dim = (
            env_meta.action_space.n
        )  # the guide's example is continuous (shape[0]); CartPole is discrete

        self.encoder = MLPEncoder(obs_dim, self.config.model_cfg.hidden_dim)
        self.actor = nn.Linear(self.encoder.out_feature_dim, action_dim)
        self.critic = nn.Linear(self.encoder.out_feature_dim, 1)

        self.encoder.to(self.device)
        self.actor.to(self.device)
        self.critic.to(self.device)

    def setup_optimizer(self, optim_cfg):
        params = (
            list(self.encoder.parameters()) + list(self.actor.parameters()) + list(self.critic.parameters())
        )
        self.optimizer = torch.optim.AdamW(params, lr=optim_cfg.lr)

    def get_action(self, obs, action=None):
        dist = Categorical(logits=self.actor(self.encoder(obs)))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy()

    def get_value(self, obs):
        return self.critic(self.encoder(obs)).squeeze(-1)

    # --- Rollout (EVAL workers) ---
    def rollout_step(self, env_ret: EnvRet, **kwargs) -> PolicyResponse:
        obs = env_ret.observation.float().unsqueeze(0).to(self.device)

        action, log_prob, entropy = self.get_action(obs)
        value = self.get_value(obs)

        return PolicyResponse(
            env_id=env_ret.env_id,
            action=action,
            log_prob=log_prob,
            entropy=entropy,
            value=value,
        )

    def postprocess(self, env_ret=None, policy_resp=None):
        pass

    # --- Training (TRAIN workers) ---
    def update_dataset(self, data):
        self.dataset = data.to(self.device)

    def train(self, *args, **kwargs):
        """A small PPO update: GAE over the [envs, T] rows, then clipped-surrogate minibatch epochs."""
        cfg = self.config.algo_cfg
        data = self.dataset
        with torch.no_grad():
            values = self.get_value(data["observation"].float())
            next_values = self.get_value(data["next_observation"].float())
            not_terminated = 1.0 - data["terminated"].float()
            continues = 1.0 - (data["terminated"] | data["truncated"]).float()
            advantages = torch.zeros_like(values)
            lastgaelam = torch.zeros_like(values[:, 0])
            for t in reversed(range(values.shape[1])):
                delta = (
                    data["reward"][:, t] + cfg.gamma * next_values[:, t] * not_terminated[:, t] - values[:, t]
                )
                lastgaelam = delta + cfg.gamma * cfg.gae_lambda * continues[:, t] * lastgaelam
                advantages[:, t] = lastgaelam
            returns = advantages + values

        b_obs = data["observation"].reshape(-1, data["observation"].shape[-1]).float()
        b_actions = data["action"].reshape(-1)
        b_logprobs = data["log_prob"].reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        batch = b_obs.shape[0]
        mb_size = max(1, batch // cfg.minibatches)
        for _ in range(cfg.update_epochs):
            order = torch.randperm(batch, device=b_obs.device)
            for start in range(0, batch - mb_size + 1, mb_size):
                mb = order[start : start + mb_size]
                _, new_logprob, entropy = self.get_action(b_obs[mb], b_actions[mb])
                ratio = (new_logprob - b_logprobs[mb]).exp()
                mb_adv = (b_advantages[mb] - b_advantages[mb].mean()) / (b_advantages[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - cfg.clip, 1 + cfg.clip)).mean()
                v_loss = 0.5 * ((self.get_value(b_obs[mb]) - b_returns[mb]) ** 2).mean()
                loss = pg_loss + 0.5 * v_loss - 0.01 * entropy.mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        self.log_metric("losses/policy_loss", pg_loss.item())
        self.log_metric("losses/value_loss", v_loss.item())
        return {"loss": loss.item()}

    # --- Weight management ---
    def get_trainable_parameters(self):
        state_dict = {}
        for name, model in self.model_list:
            module = model.module if isinstance(model, DDP) else model
            state_dict[name] = module.state_dict()
        return state_dict

    def load_state_dict(self, state_dict, strict=True, assign=False):
        for name, model in self.model_list:
            model.load_state_dict(state_dict[name], strict=strict)

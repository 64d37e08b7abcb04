"""The Customize Policy guide's snippets, assembled into one class; only ``rlightning`` became ``rlkube``.

Every method body the guide shows is here as the guide writes it: ``construct_network`` (a
continuous action space: ``action_space.shape[0]``, so it runs on Pendulum), ``setup_optimizer``,
``rollout_step`` with ``obs = env_ret.observation.float().unsqueeze(0)``, ``postprocess``,
``get_trainable_parameters`` and ``load_state_dict``. The guide leaves ``NatureCNN``,
``get_action``, ``get_value``, ``update_dataset`` and ``train`` to the user; they are written here
the way a user would. One token differs: the guide's rollout_step ends the line with ``.cuda()``,
which a CPU-only torch cannot run, so the tensor moves to CUDA only where there is one (as the
guide's own construct_network does for the models).
"""

import torch
from rlkube.policy import BasePolicy
from rlkube.types import EnvRet, PolicyResponse
from rlkube.utils.registry import POLICIES
from torch import nn
from torch.distributions import Normal
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.porting.guide_common import NatureCNN, ppo_update


@POLICIES.register("MyPolicy")
class MyPolicy(BasePolicy):
    # --- Network & optimizer ---
    def construct_network(self, env_meta, *args, **kwargs):
        action_space = env_meta.action_space
        action_dim = action_space.shape[0]

        self.encoder = NatureCNN()
        self.actor = nn.Linear(self.encoder.out_feature_dim, action_dim)
        self.critic = nn.Linear(self.encoder.out_feature_dim, 1)

        if torch.cuda.is_available():
            self.encoder.cuda()
            self.actor.cuda()
            self.critic.cuda()

    def setup_optimizer(self, optim_cfg):
        params = (
            list(self.encoder.parameters()) + list(self.actor.parameters()) + list(self.critic.parameters())
        )
        self.optimizer = torch.optim.AdamW(params, lr=optim_cfg.lr)

    # --- the user's helpers (the guide calls them) ---
    def dist(self, obs):
        return Normal(self.actor(self.encoder(obs)), 0.5)

    def get_action(self, obs):
        d = self.dist(obs)
        action = d.sample()
        return action, d.log_prob(action).sum(-1), d.entropy().sum(-1)

    def get_value(self, obs):
        return self.critic(self.encoder(obs)).squeeze(-1)

    # --- Rollout (EVAL workers) ---
    def rollout_step(self, env_ret: EnvRet, **kwargs) -> PolicyResponse:
        obs = env_ret.observation.float().unsqueeze(0)
        if torch.cuda.is_available():
            obs = obs.cuda()

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
        loss = ppo_update(self.dataset, dist=self.dist, value=self.get_value, optimizer=self.optimizer)
        return {"loss": loss}

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

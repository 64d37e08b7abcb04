"""More policies written to the Customize Policy guide, each ported by changing its imports only.

- ``GaussianPolicy``: continuous actions (Pendulum), its own log-std module;
- ``ListedPolicy``: sets ``self.model_list`` itself (the guide's Tip), leaving a helper module out;
- ``CheckpointingPolicy``: overrides ``save_checkpoint`` (optimizer state and a step counter) and
  not ``load_checkpoint``;
- ``OwnDDPPolicy``: its own ``wrap_with_ddp``, as the guide shows it but CPU-safe, wrapping only
  the actor;
- ``UnusedHeadPolicy``: the default DDP wrap, and a critic head that no training step uses;
- ``AsyncAcrobotPolicy``: ``async def rollout_step`` (``rolloutMode: async``) on a discrete env.
"""

import asyncio

import torch
from rlkube.policy import BasePolicy
from rlkube.types import EnvRet, PolicyResponse
from rlkube.utils.registry import POLICIES
from torch import nn
from torch.distributions import Categorical, Normal
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.porting.guide_common import NatureCNN, ppo_update


class _GuideStyle(BasePolicy):
    """The guide's shape: encoder, actor and critic; subclasses choose the distribution."""

    def construct_network(self, env_meta, *args, **kwargs):
        obs_dim = env_meta.observation_space.shape[0]
        self.encoder = NatureCNN(obs_dim)
        self.actor = nn.Linear(self.encoder.out_feature_dim, self.action_dim(env_meta.action_space))
        self.critic = nn.Linear(self.encoder.out_feature_dim, 1)

    def setup_optimizer(self, optim_cfg):
        params = (
            list(self.encoder.parameters()) + list(self.actor.parameters()) + list(self.critic.parameters())
        )
        self.optimizer = torch.optim.AdamW(params, lr=optim_cfg.lr)

    def get_value(self, obs):
        return self.critic(self.encoder(obs)).squeeze(-1)

    def rollout_step(self, env_ret: EnvRet, **kwargs) -> PolicyResponse:
        obs = env_ret.observation.float().unsqueeze(0)
        d = self.dist(obs)
        action = d.sample()
        log_prob = d.log_prob(action)
        if log_prob.ndim > 1:
            log_prob = log_prob.sum(-1)
        return PolicyResponse(
            env_id=env_ret.env_id, action=action, log_prob=log_prob, value=self.get_value(obs)
        )

    def postprocess(self, env_ret=None, policy_resp=None):
        pass

    def update_dataset(self, data):
        self.dataset = data

    def train(self, *args, **kwargs):
        return {
            "loss": ppo_update(self.dataset, dist=self.dist, value=self.get_value, optimizer=self.optimizer)
        }


@POLICIES.register("GaussianPolicy")
class GaussianPolicy(_GuideStyle):
    def action_dim(self, space):
        return space.shape[0]

    def construct_network(self, env_meta, *args, **kwargs):
        super().construct_network(env_meta, *args, **kwargs)
        self.log_std = nn.Linear(
            1, env_meta.action_space.shape[0], bias=False
        )  # a module: model_list finds it

    def setup_optimizer(self, optim_cfg):
        super().setup_optimizer(optim_cfg)
        self.optimizer.add_param_group({"params": self.log_std.parameters()})

    def dist(self, obs):
        std = self.log_std.weight.squeeze(-1).exp()
        return Normal(self.actor(self.encoder(obs)), std)


class _Discrete:
    def action_dim(self, space):
        return space.n

    def dist(self, obs):
        return Categorical(logits=self.actor(self.encoder(obs)))


@POLICIES.register("ListedPolicy")
class ListedPolicy(_Discrete, _GuideStyle):
    def construct_network(self, env_meta, *args, **kwargs):
        super().construct_network(env_meta, *args, **kwargs)
        self.scratch = nn.Linear(2, 2)  # trainable, but not part of the policy: left out of model_list
        self.model_list = [("encoder", self.encoder), ("actor", self.actor), ("critic", self.critic)]


@POLICIES.register("CheckpointingPolicy")
class CheckpointingPolicy(_Discrete, _GuideStyle):
    updates = 0

    def train(self, *args, **kwargs):
        self.updates += 1
        return super().train(*args, **kwargs)

    def save_checkpoint(self, path):
        torch.save(
            {
                "weights": {name: model.state_dict() for name, model in self.model_list},
                "optimizer": self.optimizer.state_dict(),
                "updates": self.updates,
            },
            path,
        )


@POLICIES.register("OwnDDPPolicy")
class OwnDDPPolicy(_Discrete, _GuideStyle):
    def construct_network(self, env_meta, *args, **kwargs):
        super().construct_network(env_meta, *args, **kwargs)
        self.aux_head = nn.Linear(self.encoder.out_feature_dim, 1)  # trained by no step: unused by DDP

    def wrap_with_ddp(self, logic_gpu_id, process_group):
        if torch.cuda.is_available():
            self.actor = DDP(self.actor.cuda(), device_ids=[logic_gpu_id], process_group=process_group)
        else:
            self.actor = DDP(self.actor, process_group=process_group)


class CriticWithAux(nn.Module):
    """A value head and an auxiliary head that ``forward`` does not use (e.g. for a later phase)."""

    def __init__(self, features):
        super().__init__()
        self.value = nn.Linear(features, 1)
        self.aux = nn.Linear(features, 1)

    def forward(self, x):
        return self.value(x)


@POLICIES.register("UnusedHeadPolicy")
class UnusedHeadPolicy(_Discrete, _GuideStyle):
    """The default DDP wrap, and a critic whose auxiliary head no training step uses."""

    def construct_network(self, env_meta, *args, **kwargs):
        super().construct_network(env_meta, *args, **kwargs)
        self.critic = CriticWithAux(self.encoder.out_feature_dim)


@POLICIES.register("AsyncAcrobotPolicy")
class AsyncAcrobotPolicy(_Discrete, _GuideStyle):
    async def rollout_step(self, env_ret: EnvRet, **kwargs) -> PolicyResponse:
        await asyncio.sleep(0)  # e.g. waiting for a batching server
        return _GuideStyle.rollout_step(self, env_ret, **kwargs)

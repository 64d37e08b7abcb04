"""A tiny BasePolicy for weight-plane tests (parameters, buffers, two modules; no env needed)."""

from __future__ import annotations

import torch
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.base import BasePolicy, PolicyRole
from rlkube.spec import PolicySpec
from torch import nn


class TinyPolicy(BasePolicy):
    def construct_network(self, env_meta: object = None, *args: object, **kwargs: object) -> None:
        hidden = int(self.config.model_cfg.get("hidden", 8))
        self.actor = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))
        self.critic = nn.Sequential(nn.Linear(4, hidden), nn.BatchNorm1d(hidden), nn.Linear(hidden, 1))

    def setup_optimizer(self, optim_cfg: object) -> None:
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.1)

    def rollout_step(self, env_ret: EnvRet, **kwargs: object) -> PolicyResponse:
        return PolicyResponse(env_id=env_ret.env_id, action=self.actor(env_ret.observation).argmax(-1))

    def postprocess(self, env_ret: object = None, policy_resp: object = None) -> None:
        return None

    def update_dataset(self, data: object) -> None:
        self.dataset = data

    def train(self, *args: object, **kwargs: object) -> dict[str, float]:
        """A fake epoch: every parameter and buffer moves, so each version is different."""
        with torch.no_grad():
            for _, model in self.model_list:
                for tensor in [*model.parameters(), *model.buffers()]:
                    if tensor.is_floating_point():
                        tensor.add_(torch.randn_like(tensor) * 0.1)
                    else:
                        tensor.add_(1)
        return {}


def tiny_policy(
    role: PolicyRole | str,
    *,
    strategy: str = "Shared",
    rollout_mode: str = "sync",
    hidden: int = 8,
    seed: int = 0,
) -> TinyPolicy:
    """An uninitialised TinyPolicy (call init_train / attach + init_eval)."""
    torch.manual_seed(seed)
    spec = PolicySpec.model_validate(
        {
            "type": "Tiny",
            "rolloutMode": rollout_mode,
            "modelCfg": {"hidden": hidden},
            "weightBuffer": {"strategy": strategy},
        }
    )
    return TinyPolicy(spec, role)


def observation(n: int = 3) -> EnvRet:
    return EnvRet(env_id=torch.arange(n), observation=torch.randn(n, 4))

"""RLightning's SimplePPOPolicy as ported in examples/simple_ppo_policy.py, on a CPU-only machine.

The original moves tensors with ``.cuda()`` unconditionally in three places (``evaluate``,
``update_dataset``, ``rollout_step``), which torch refuses without a GPU. This subclass changes
exactly those three moves to ``self.device`` and nothing else; every other line that runs is the
ported class's own (``examples/simple_ppo.yaml`` runs the original on a GPU).
"""

from __future__ import annotations

from typing import Any

import torch
from rlkube.types import EnvRet, PolicyResponse
from rlkube.utils.profiler import profiler
from rlkube.utils.registry import POLICIES
from tensordict import TensorDict

from examples.simple_ppo_policy import SimplePPOPolicy


@POLICIES.register("SimplePPOPolicyOnCPU")
class SimplePPOPolicyOnCPU(SimplePPOPolicy):
    def evaluate(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.evaluate_on_device(obs.to(self.device), action.to(self.device))

    def update_dataset(self, data: Any) -> None:
        self.data = TensorDict.from_dict(data, auto_batch_size=True, device=self.device)

    @profiler.timer_wrap(level="debug")
    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        obs_tensor = env_ret.observation.float().unsqueeze(0).to(self.device)
        action, log_prob, entropy, value = self.get_action_value(obs_tensor)
        return PolicyResponse(
            env_id=env_ret.env_id, action=action, log_prob=log_prob, entropy=entropy, value=value
        )

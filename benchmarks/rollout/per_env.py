"""``PPOPerEnv``: the built-in PPO served one env per request (RLightning's model) for the rollout bench.

The same actor-critic and the same maths as ``PPO``; only ``rollout_step`` differs: it receives
one env's unbatched observation, ``unsqueeze(0)``s it as the Customize Policy guide does, and the
rollout loop stacks the per-env answers. Comparing it with ``PPO`` (batched requests) measures the
per-env request overhead. Listed in ``spec.imports`` so every process registers it.
"""

from __future__ import annotations

from typing import Any

from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.base import RequestMode
from rlkube.policy.builtin.ppo import PPO
from rlkube.policy.registry import POLICIES


@POLICIES.register("PPOPerEnv")
class PPOPerEnv(PPO):
    request_mode = RequestMode.PER_ENV

    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        obs = env_ret.observation.unsqueeze(0)
        action, log_prob, _, value = self.model(obs, deterministic=deterministic)
        return PolicyResponse(env_id=env_ret.env_id, action=action, log_prob=log_prob, value=value)

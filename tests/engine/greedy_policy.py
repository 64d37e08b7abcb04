"""GreedyPPO: PPO that always takes its greedy action, so a seeded run is the same run every time.

Imported by jobs through ``spec.imports`` (eval pods of a local cluster import it too).
"""

from __future__ import annotations

from typing import Any

from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy import POLICIES
from rlkube.policy.builtin.ppo import PPO


@POLICIES.register("GreedyPPO")
class GreedyPPO(PPO):
    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        return super().rollout_step(env_ret, deterministic=True, **kwargs)

"""A guide-style policy that raises in the method ``modelCfg.fail_in`` names, and an env whose step raises.

User code, as a user would write it (imports from rlkube only): the failure tests check that the
exception's type, its message and this file's frame reach the console and summary.json.
"""

import gymnasium as gym
import numpy as np
from rlkube.utils.registry import POLICIES

from tests.porting.guide_policy import MyPolicy


class PolicyBug(Exception):
    pass


def fail_if(policy, stage):
    if policy.config.model_cfg.get("fail_in") == stage:
        raise PolicyBug(f"deliberate failure in {stage}")


@POLICIES.register("FailingPolicy")
class FailingPolicy(MyPolicy):
    def construct_network(self, env_meta, *args, **kwargs):
        if self.role_type == "eval":
            fail_if(self, "construct_network")
        super().construct_network(env_meta, *args, **kwargs)

    def init_eval(self, eval_config=None, env_meta=None):
        fail_if(self, "init_eval")
        super().init_eval(eval_config, env_meta)

    def rollout_step(self, env_ret, **kwargs):
        fail_if(self, "rollout_step")
        return super().rollout_step(env_ret, **kwargs)

    def postprocess(self, env_ret=None, policy_resp=None):
        fail_if(self, "postprocess")


class FailingEnv(gym.Env):
    """Pendulum-shaped observations and actions; the fourth step raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t > 3:
            raise RuntimeError("the simulator lost its connection")
        return np.zeros(3, np.float32), 0.0, False, False, {}


if "RlkubeFailing-v0" not in gym.registry:
    gym.register("RlkubeFailing-v0", entry_point=FailingEnv, max_episode_steps=50)

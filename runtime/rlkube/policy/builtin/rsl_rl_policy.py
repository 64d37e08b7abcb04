"""``RSLRLPolicy`` (``spec.policy.type: RSLRLPolicy``): the rsl_rl library's PPO behind BasePolicy.

I/O-free, but imports the optional ``rsl_rl`` (``pip install 'rlkube[rsl]'``; rsl-rl-lib 5.x,
checked with 5.5.1) when the policy is constructed. Meant for ``engine: rsl`` (RLightning's
RSLRLEngine): every epoch, each env's fragment continues where the last one stopped, and the
whole epoch is one rsl_rl rollout storage (``num_steps_per_env = train.fragmentLength``,
``num_envs`` = the rank's rows); rsl_rl mini-batches it itself (``numMiniBatches``), so
``train.batchSize`` does not apply (RLightning's ``batch_size: -1``).

``spec.policy.algoCfg`` is rsl_rl's own train configuration, in its spelling: ``algorithm``
(keyword arguments of ``rsl_rl.algorithms.PPO``: ``num_learning_epochs``, ``num_mini_batches``,
``clip_param``, ``gamma``, ``lam``, ``learning_rate``, ``schedule``, ``desired_kl``, ...), ``actor``
and ``critic`` (``rsl_rl.models.MLPModel``: ``hidden_dims``, ``activation``, ``obs_normalization``;
the actor's ``distribution_cfg``). Missing keys take rsl_rl's defaults; ``class_name`` may name
another rsl_rl class. Observations reach rsl_rl as the group ``policy`` (actor and critic alike).

Transitions go into rsl_rl's storage as its runner would put them: the values and distribution
parameters are recomputed by the trainer's critic and actor (the weights that collected the epoch,
under ``engine: rsl``), the behaviour log-probs come with the fragment, time-outs bootstrap by
rsl_rl's own rule (``reward += gamma * V(s) * time_out``) and ``compute_returns`` bootstraps the
fragment's end from the last next observation. ``train`` is ``PPO.update()``; its losses are logged
as ``losses/<name>`` and the adaptive learning rate as ``charts/learning_rate``.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rlkube.data.fragment import NEXT_OBSERVATION, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.policy.base import BasePolicy, PolicyRole, RequestMode
from rlkube.policy.registry import POLICIES
from rlkube.spec import BufferType, SpecError

#: rsl_rl's observation group name for what the env returns.
OBS_GROUP = "policy"

DEFAULT_CFG: dict[str, dict[str, Any]] = {
    "algorithm": {"class_name": "PPO"},
    "actor": {
        "class_name": "MLPModel",
        "hidden_dims": [256, 256, 256],
        "activation": "elu",
        "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0},
    },
    "critic": {"class_name": "MLPModel", "hidden_dims": [256, 256, 256], "activation": "elu"},
}


def rsl_rl_cfg(algo_cfg: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """rsl_rl's sections with the defaults filled in; an unknown section is a SpecError."""
    given = dict(algo_cfg or {})
    unknown = sorted(set(given) - set(DEFAULT_CFG))
    if unknown:
        raise SpecError(
            [
                f"spec.policy.algoCfg.{key}: unknown section (known: algorithm, actor, critic)"
                for key in unknown
            ],
            source="spec.policy.algoCfg",
        )
    cfg = copy.deepcopy(DEFAULT_CFG)
    for section, values in given.items():
        if not isinstance(values, dict):
            raise SpecError(
                [f"spec.policy.algoCfg.{section}: expected a mapping"], source="spec.policy.algoCfg"
            )
        cfg[section].update(values)
    return cfg


@POLICIES.register("RSLRLPolicy")
class RSLRLPolicy(BasePolicy):
    """rsl_rl's PPO on rlkube's fragments; see the module docstring."""

    request_mode = RequestMode.BATCHED
    supported_buffers = frozenset({BufferType.ROLLOUT})

    def __init__(self, config: Any, role_type: PolicyRole | str) -> None:
        super().__init__(config, role_type)
        try:
            import rsl_rl  # noqa: F401
        except ImportError as exc:
            raise SpecError(
                [f"spec.policy.type: RSLRLPolicy needs rsl-rl-lib (pip install 'rlkube[rsl]'): {exc}"],
                source="spec.policy.type",
            ) from None
        self.cfg = rsl_rl_cfg(config.algo_cfg)
        self.alg: Any = None

    # ------------------------------------------------------------------ network and optimizer
    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        from rsl_rl.storage import RolloutStorage
        from rsl_rl.utils import resolve_class

        space = env_meta.action_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(
                f"RSLRLPolicy needs a Box action space (rsl_rl's distributions); the env has {space}"
            )
        obs_dim = int(np.prod(env_meta.observation_space.shape))
        self.num_actions = int(np.prod(space.shape))
        self.action_shape = tuple(space.shape)
        example = self.as_obs(torch.zeros(1, obs_dim))
        groups = {"actor": [OBS_GROUP], "critic": [OBS_GROUP]}
        actor_class, actor_cfg = resolve_class(self.cfg["actor"])
        critic_class, critic_cfg = resolve_class(self.cfg["critic"])
        self.actor = actor_class(example, groups, "actor", self.num_actions, **actor_cfg).to(self.device)
        self.critic = critic_class(example, groups, "critic", 1, **critic_cfg).to(self.device)
        self._alg_class, self._alg_cfg = resolve_class(self.cfg["algorithm"])
        self._storage_class = RolloutStorage

    def wrap_with_ddp(self, gpu_id: int, process_group: Any) -> None:
        """Not wrapped: rsl_rl reduces the gradients itself (its ``multi_gpu_cfg``)."""

    def setup_optimizer(self, optim_cfg: Any) -> None:
        """rsl_rl's PPO owns its optimizer (``algorithm.learning_rate``, ``optimizer``)."""
        world = getattr(self, "world_size", 1)
        multi_gpu = None
        if world > 1 and torch.distributed.is_initialized():
            multi_gpu = {"global_rank": torch.distributed.get_rank(), "world_size": world}
        # The storage is sized per update_dataset (rows x T are known only then).
        self.alg = self._alg_class(
            self.actor, self.critic, None, device=self.device, multi_gpu_cfg=multi_gpu, **self._alg_cfg
        )
        self.optimizer = self.alg.optimizer  # checkpointed by the engine (BasePolicy.optimizers)

    @staticmethod
    def as_obs(obs: torch.Tensor) -> TensorDict:
        flat = obs.reshape(obs.shape[0], -1).float()
        return TensorDict({OBS_GROUP: flat}, batch_size=[flat.shape[0]])

    # ------------------------------------------------------------------ rollout (EVAL)
    def rollout_step(self, env_ret: EnvRet, deterministic: bool = False, **kwargs: Any) -> PolicyResponse:
        obs = self.as_obs(torch.as_tensor(env_ret.observation, device=self.device))
        actions = self.actor(obs, stochastic_output=True)
        log_prob = self.actor.get_output_log_prob(actions)
        if deterministic:
            actions = self.actor(obs)
        return PolicyResponse(
            env_id=env_ret.env_id, action=actions.reshape(-1, *self.action_shape), log_prob=log_prob
        )

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        return None

    # ------------------------------------------------------------------ training (TRAIN)
    @torch.no_grad()
    def update_dataset(self, data: TensorDict) -> None:
        """The rank's ``[rows, T]`` share as one rsl_rl rollout storage, returns computed."""
        data = data.to(self.device)
        rows, steps = data.batch_size
        alg = self.alg
        first = self.as_obs(data[OBSERVATION][:, 0])
        alg.storage = self._storage_class("rl", rows, steps, first, [self.num_actions], self.device)
        for t in range(steps):
            obs = self.as_obs(data[OBSERVATION][:, t])
            transition = alg.transition
            transition.hidden_states = (None, None)
            transition.actions = data["action"][:, t].reshape(rows, self.num_actions).float()
            transition.values = self.critic(obs)
            self.actor(obs, stochastic_output=True)  # sets the distribution of these observations
            transition.distribution_params = tuple(p.detach() for p in self.actor.output_distribution_params)
            transition.actions_log_prob = data["log_prob"][:, t].float()
            transition.observations = obs
            dones = (data[TERMINATED][:, t] | data[TRUNCATED][:, t]).float()
            extras = {"time_outs": data[TRUNCATED][:, t].float()}
            alg.process_env_step(obs, data[REWARD][:, t].float(), dones, extras)
        alg.compute_returns(self.as_obs(data[NEXT_OBSERVATION][:, steps - 1]))
        self.dataset = data

    def train(self, *args: Any, **kwargs: Any) -> dict[str, float]:  # type: ignore[override]  # RLightning's train()
        if self.alg is None or self.alg.storage is None:
            raise RuntimeError("RSLRLPolicy.train needs init_train() and update_dataset() first")
        self.alg.learning_rate = float(self.alg.optimizer.param_groups[0]["lr"])  # after a checkpoint load
        losses = self.alg.update()
        metrics = {f"losses/{key}": float(value) for key, value in losses.items() if value is not None}
        metrics["charts/learning_rate"] = float(self.alg.learning_rate)
        for key, value in metrics.items():
            self.log_metric(key, value)
        return metrics

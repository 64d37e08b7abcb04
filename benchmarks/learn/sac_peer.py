"""The peer for SAC jobs: Stable-Baselines3's SAC given the job's hyperparameters (bench extra only).

Mapping (rlkube ``spec`` -> SB3 ``SAC(...)``), chosen so both run the same schedule:

* ``n_envs = env.numEnvs``; ``train_freq = stepsPerEpoch // numEnvs`` steps and ``gradient_steps =
  round(updatesPerStep * stepsPerEpoch)``: both collect an epoch with fixed weights, then take that
  many gradient steps; ``learning_starts = 0`` (rlkube's first epoch is collected by the initial
  actor, not by uniform actions, and trained on as soon as it is in).
* ``batch_size = train.batchSize``, ``buffer_size = buffer.capacity``, ``learning_rate = lr`` (actor,
  critics and temperature alike in both), ``gamma``, ``tau``.
* ``ent_coef = "auto_<initAlpha>"`` (learned) or ``initAlpha`` (fixed); ``target_entropy`` "auto"
  (``-dim(A)``) or the job's value.
* ``policy_kwargs``: ``net_arch = hiddenSizes`` for actor and critics, the same activation.

SB3 records raw episode returns through its ``Monitor``, stamped with the steps collected at the
end of the rollout they finished in, as rlkube stamps them at the end of their epoch.
"""

from __future__ import annotations

import time
from typing import Any

from rlkube.policy.builtin.ppo_config import parse_section
from rlkube.policy.builtin.sac_config import SACAlgoConfig, SACModelConfig, SACOptimConfig
from rlkube.spec import RLJob

from benchmarks.learn.curve import Curve, steps_to_target

_ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "gelu": "GELU", "silu": "SiLU"}


def sb3_sac_kwargs(job: RLJob) -> dict[str, Any]:
    """``SAC(...)`` keyword arguments equivalent to ``job`` (see the module docstring)."""
    import torch

    spec = job.spec
    algo = parse_section(SACAlgoConfig, spec.policy.algo_cfg, path="spec.policy.algoCfg")
    optim = parse_section(SACOptimConfig, spec.policy.optim_cfg, path="spec.policy.optimCfg")
    model = parse_section(SACModelConfig, spec.policy.model_cfg, path="spec.policy.modelCfg")
    return {
        "learning_rate": optim.lr,
        "buffer_size": spec.buffer.capacity,
        "learning_starts": 0,
        "batch_size": spec.train.batch_size,
        "tau": algo.tau,
        "gamma": algo.gamma,
        "train_freq": (max(1, spec.train.steps_per_epoch // spec.env.num_envs), "step"),
        "gradient_steps": max(1, round(algo.updates_per_step * spec.train.steps_per_epoch)),
        "ent_coef": f"auto_{algo.init_alpha}" if algo.learn_alpha else algo.init_alpha,
        "target_entropy": "auto" if algo.target_entropy is None else algo.target_entropy,
        "policy_kwargs": {
            "net_arch": list(model.hidden_sizes),
            "activation_fn": getattr(torch.nn, _ACTIVATIONS[model.activation]),
        },
    }


def run_sb3_sac(job: RLJob, *, seed: int, budget: int, stop_at_target: bool) -> Curve:
    """Train SB3's SAC on ``job``'s env for ``budget`` env steps (or to the target); raw returns."""
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    spec = job.spec
    target = spec.train.target_return
    curve = Curve(side="sb3", seed=seed)

    class _Episodes(BaseCallback):
        pending: list[float] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                episode = info.get("episode")
                if episode is not None:
                    self.pending.append(float(episode["r"]))
            return True

        def _on_rollout_end(self) -> None:
            curve.episodes.extend((int(self.num_timesteps), r) for r in self.pending)
            self.pending.clear()
            if stop_at_target and target is not None and steps_to_target(curve.episodes, target) is not None:
                self.model.num_timesteps = budget

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        envs = make_vec_env(
            spec.env.id, n_envs=spec.env.num_envs, seed=seed, env_kwargs=dict(spec.env.kwargs)
        )
        model = SAC("MlpPolicy", envs, seed=seed, device="cpu", verbose=0, **sb3_sac_kwargs(job))
        started = time.monotonic()
        model.learn(total_timesteps=budget, callback=_Episodes())
        curve.wall_seconds = time.monotonic() - started
        envs.close()
    finally:
        torch.set_num_threads(previous)
    curve.env_steps = min(int(model.num_timesteps), budget)
    if target is not None:
        curve.steps_to_target = steps_to_target(curve.episodes, target)
    return curve

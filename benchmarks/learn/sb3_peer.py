"""The peer: Stable-Baselines3's PPO given the reference job's hyperparameters (bench extra only).

Mapping (rlkube ``spec`` -> SB3 ``PPO(...)``), chosen so both optimise the same objective:

* ``n_envs = env.numEnvs``, ``n_steps = train.stepsPerEpoch // numEnvs`` (one update per
  ``stepsPerEpoch`` transitions in both), ``batch_size = train.batchSize``,
  ``n_epochs = algoCfg.updateEpochs``; ``gamma``, ``gae_lambda``, ``clip_range = clipCoef``,
  ``ent_coef``, ``max_grad_norm``, ``normalize_advantage = normAdv``.
* ``vf_coef = vfCoef / 2``: SB3's value loss is ``mse(R, V)``, rlkube's (CleanRL's) is
  ``0.5 * mse``; the same total loss needs half the coefficient.
* ``clip_range_vf = clipCoef`` when ``clipVloss`` is on, else None (SB3's default is off). SB3
  trains the clipped value's loss alone, which is rlkube's ``clipVlossForm: clipped``; rlkube's
  default ``max`` (CleanRL's) has no SB3 equivalent.
* ``normalizeObservation`` -> ``VecNormalize(norm_obs)``, whose statistics move at every env step:
  rlkube's ``observationStats: perStep`` (its default ``perUpdate`` has no SB3 equivalent).
* ``learning_rate``: linear to 0 over the budget when ``annealLr`` (SB3 evaluates the schedule at
  the start of each update, rlkube at the end of the previous one: equal up to one update).
* ``policy_kwargs``: separate ``pi``/``vf`` MLPs of ``hiddenSizes``, the same activation,
  ``ortho_init``, ``log_std_init = initLogStd``; Adam with ``eps``.
* ``encoder: nature_cnn`` -> ``CnnPolicy`` (SB3's NatureCNN, shared by actor and critic, as ours).
* ``target_kl``: SB3 stops inside an epoch at 1.5x; rlkube after an epoch whose mean KL exceeds it.
* envs: SB3's ``Monitor`` innermost (raw returns, as rlkube reports), then the job's
  ``spec.env.wrappers`` except ``ClipAction``: gymnasium's widens the action space to
  (-inf, inf), which SB3 refuses, and SB3 clips every Box action to the env's bounds itself --
  the same clip; ``normalizeObservation`` -> ``VecNormalize(norm_obs=True, norm_reward=False)``.

SB3 is imported only here, when the bench runs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from rlkube.envs.group import import_env_modules
from rlkube.envs.wrappers import apply_wrappers
from rlkube.policy.builtin.ppo_config import PPOAlgoConfig, PPOModelConfig, PPOOptimConfig, parse_section
from rlkube.spec import ClipActionWrapper, RLJob

from benchmarks.learn.curve import Curve, steps_to_target

_ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "gelu": "GELU", "silu": "SiLU"}


def _sections(job: RLJob) -> tuple[PPOAlgoConfig, PPOOptimConfig, PPOModelConfig]:
    policy = job.spec.policy
    return (
        parse_section(PPOAlgoConfig, policy.algo_cfg, path="spec.policy.algoCfg"),
        parse_section(PPOOptimConfig, policy.optim_cfg, path="spec.policy.optimCfg"),
        parse_section(PPOModelConfig, policy.model_cfg, path="spec.policy.modelCfg"),
    )


def sb3_kwargs(job: RLJob) -> dict[str, Any]:
    """``PPO(...)`` keyword arguments equivalent to ``job`` (see the module docstring)."""
    import torch

    spec = job.spec
    algo, optim, model = _sections(job)
    lr = optim.lr
    learning_rate: float | Callable[[float], float] = (
        (lambda progress: lr * progress) if optim.anneal_lr else lr
    )
    policy_kwargs: dict[str, Any] = {"ortho_init": model.ortho_init, "optimizer_kwargs": {"eps": optim.eps}}
    if model.encoder == "mlp":
        policy_kwargs |= {
            "net_arch": {"pi": list(model.hidden_sizes), "vf": list(model.hidden_sizes)},
            "activation_fn": getattr(torch.nn, _ACTIVATIONS[model.activation]),
            "log_std_init": model.init_log_std,
        }
    return {
        "policy": "CnnPolicy" if model.encoder == "nature_cnn" else "MlpPolicy",
        "n_steps": max(1, spec.train.steps_per_epoch // spec.env.num_envs),
        "batch_size": spec.train.batch_size,
        "n_epochs": algo.update_epochs,
        "gamma": algo.gamma,
        "gae_lambda": algo.gae_lambda,
        "clip_range": algo.clip_coef,
        "clip_range_vf": algo.clip_coef if algo.clip_vloss else None,
        "normalize_advantage": algo.norm_adv,
        "ent_coef": algo.ent_coef,
        "vf_coef": algo.vf_coef / 2.0,
        "max_grad_norm": optim.max_grad_norm if optim.max_grad_norm is not None else 1e12,
        "target_kl": algo.target_kl,
        "learning_rate": learning_rate,
        "policy_kwargs": policy_kwargs,
    }


def run_sb3(job: RLJob, *, seed: int, budget: int, stop_at_target: bool, into: Curve | None = None) -> Curve:
    """Train SB3's PPO on ``job``'s env for ``budget`` env steps (or to the target); raw returns.

    ``into``: filled as the run goes (another thread may read it), else a new one.
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecEnv, VecNormalize

    spec = job.spec
    target = spec.train.target_return
    curve = into if into is not None else Curve(side="sb3", seed=seed)

    class _Episodes(BaseCallback):
        # Episodes are stamped with the steps collected at the end of their rollout, as rlkube's
        # tracker stamps them at the end of their epoch: the same accounting on both sides.
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
                self.model.num_timesteps = budget  # SB3 stops when the budget is spent

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        import_env_modules(spec.env.imports)
        wrappers = tuple(w for w in spec.env.wrappers if not isinstance(w, ClipActionWrapper))
        envs: VecEnv = make_vec_env(
            spec.env.id,
            n_envs=spec.env.num_envs,
            seed=seed,
            env_kwargs=dict(spec.env.kwargs),
            wrapper_class=functools.partial(apply_wrappers, wrappers=wrappers) if wrappers else None,
        )
        _, _, model_cfg = _sections(job)
        if model_cfg.normalize_observation:
            envs = VecNormalize(envs, norm_obs=True, norm_reward=False, clip_obs=model_cfg.observation_clip)
        model = PPO(env=envs, seed=seed, device="cpu", verbose=0, **sb3_kwargs(job))
        started = time.monotonic()
        model.learn(total_timesteps=budget, callback=_Episodes())
        curve.wall_seconds = time.monotonic() - started
        envs.close()
    finally:
        torch.set_num_threads(previous)
    collected = curve.episodes[-1][0] if curve.episodes else 0
    curve.env_steps = collected if stop_at_target else min(int(model.num_timesteps), budget)
    if target is not None:
        curve.steps_to_target = steps_to_target(curve.episodes, target)
    return curve

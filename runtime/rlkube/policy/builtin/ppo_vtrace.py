"""The built-in PPO's off-policy correction: V-trace advantages and returns for stale rows.

Pure (no I/O). Used when the async engine runs with ``train.staleFragments: vtrace`` and so tags
every fragment with ``policy_lag``, the versions its weights are behind the learner's. Rows of lag
0 keep PPO's GAE; a stale row gets V-trace's targets and advantages (``rlkube.policy.utils.vtrace``)
with the importance weights pi_current / mu_behaviour of its actions, clipped by
``train.vtraceRhoClip`` and ``train.vtraceCClip``, and lambda = ``algoCfg.gaeLambda`` (so on-policy,
V-trace's targets are GAE's returns). The clipped surrogate still takes its ratio against the
behaviour log-probs, as RLightning's ``ppo_vtrace`` does (clipping against the learner's policy
instead, the decoupled objective, measured worse: docs/performance.md, "Stale fragments").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from rlkube.data.fragment import POLICY_LAG, REWARD, TERMINATED, TRUNCATED
from rlkube.policy.builtin.actor_critic import ActorCritic
from rlkube.policy.utils.vtrace import vtrace_correction


@dataclass(frozen=True)
class Corrected:
    """``[rows, T]`` advantages and returns, stale rows corrected; the stale rows' mean clipped rho."""

    advantages: torch.Tensor
    returns: torch.Tensor
    stale_rows: int
    mean_clipped_rho: float | None


@torch.no_grad()
def correct_stale_rows(
    model: ActorCritic,
    data: TensorDict,
    *,
    values: torch.Tensor,
    next_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    rho_bar: float,
    c_bar: float,
) -> Corrected:
    """GAE's ``advantages``/``returns`` where ``policy_lag`` is 0, V-trace's on every stale row."""
    stale = (data[POLICY_LAG] > 0).any(dim=-1)
    count = int(stale.sum())
    if count == 0:
        return Corrected(advantages, returns, 0, None)
    rows = data[stale]
    steps = rows.batch_size[1]
    obs = rows["observation"].reshape(count * steps, *rows["observation"].shape[2:])
    actions = rows["action"].reshape(count * steps, *rows["action"].shape[2:])
    _, log_prob, _, _ = model(obs, actions)
    log_rhos = log_prob.reshape(count, steps).float() - rows["log_prob"].reshape(count, steps).float()
    terminated, truncated = rows[TERMINATED].bool(), rows[TRUNCATED].bool()
    vs, pg_advantages = vtrace_correction(
        rows[REWARD],
        values[stale],
        next_values[stale],
        terminated | truncated,
        log_rhos,
        gamma,
        rho_bar,
        c_bar,
        terminated=terminated,
        lambda_=gae_lambda,
    )
    advantages, returns = advantages.clone(), returns.clone()
    advantages[stale] = pg_advantages
    returns[stale] = vs
    mean_rho = float(torch.clamp(log_rhos.exp(), max=rho_bar).mean())
    return Corrected(advantages, returns, count, mean_rho)

"""The built-in PPO's off-policy correction: V-trace advantages and returns for stale rows.

Pure (no I/O). Used when the async engine runs with ``train.staleFragments: vtrace`` and so tags
every fragment with ``policy_lag``, the versions its weights are behind the learner's. Rows of lag
0 keep PPO's GAE; a stale row gets V-trace's targets and advantages (``rlkube.policy.utils.vtrace``)
with the importance weights pi_current / mu_behaviour of its actions, clipped by
``train.vtraceRhoClip`` and ``train.vtraceCClip``, and lambda = ``algoCfg.gaeLambda`` (so on-policy,
V-trace's targets are GAE's returns).

What a stale row's clipped ratio is taken against is ``train.vtraceClipAnchor``. ``learner`` (the
default): the learner's policy when the update began, pi_current; the advantage already carries
the importance weight rho_t = min(rho_bar, pi_current/mu), so at the update's start the gradient
is IMPALA's, rho_t * grad log pi * (r_t + gamma v_{t+1} - V(x_t)), and the update may move the
policy a whole clip range from where it is, as on fresh rows. ``behaviour``: the behaviour
log-probs, as RLightning's ``ppo_vtrace``; the learner's last update has then already spent part
of the clip range, and rows it pushed past the range give no gradient. Measured on CartPole at one
version of lag (learner 1.13-1.15x sync's env steps, behaviour 1.23x in the same run):
docs/performance.md, "Stale fragments".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from rlkube.data.fragment import POLICY_LAG, REWARD, TERMINATED, TRUNCATED
from rlkube.policy.builtin.actor_critic import ActorCritic
from rlkube.policy.utils.vtrace import vtrace_correction
from rlkube.spec import VtraceClipAnchor


@dataclass(frozen=True)
class Corrected:
    """``[rows, T]`` advantages, returns and the log-probs the clipped ratio is taken against.

    ``anchor_log_prob`` is the behaviour log-probs, with the learner's in the stale rows when the
    anchor is ``learner``; ``mean_clipped_rho`` is the stale rows' mean clipped rho.
    """

    advantages: torch.Tensor
    returns: torch.Tensor
    anchor_log_prob: torch.Tensor
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
    anchor: VtraceClipAnchor = VtraceClipAnchor.LEARNER,
) -> Corrected:
    """GAE's ``advantages``/``returns`` where ``policy_lag`` is 0, V-trace's on every stale row."""
    behaviour = data["log_prob"].float()
    stale = (data[POLICY_LAG] > 0).any(dim=-1)
    count = int(stale.sum())
    if count == 0:
        return Corrected(advantages, returns, behaviour, 0, None)
    rows = data[stale]
    steps = rows.batch_size[1]
    obs = rows["observation"].reshape(count * steps, *rows["observation"].shape[2:])
    actions = rows["action"].reshape(count * steps, *rows["action"].shape[2:])
    _, log_prob, _, _ = model(obs, actions)
    learner_log_prob = log_prob.reshape(count, steps).float()
    log_rhos = learner_log_prob - behaviour[stale]
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
    if anchor is VtraceClipAnchor.BEHAVIOUR:
        return Corrected(advantages, returns, behaviour, count, mean_rho)
    anchor_log_prob = behaviour.clone()  # (float() of float32 log-probs is the fragment's own tensor)
    anchor_log_prob[stale] = learner_log_prob
    return Corrected(advantages, returns, anchor_log_prob, count, mean_rho)

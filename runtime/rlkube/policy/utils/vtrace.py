"""V-trace (Espeholt et al. 2018, IMPALA): value targets and advantages for off-policy fragments.

Pure: tensors in, tensors out. RLightning's ``rlightning.policy.utils.vtrace.vtrace_correction``
under the same name and positional arguments, for rlkube's layout: time is the *last* axis, so
one trajectory ``[T]`` and a fragment's ``[num_envs, T]`` both work.

Notation as in the paper. The behaviour policy mu collected the fragment (its log-probs travel
with every fragment as ``log_prob``), the learner's policy is pi, ``log_rhos = log pi - log mu``:

    rho_t   = min(rho_bar, pi/mu)              truncated importance weight of the TD error
    c_t     = lambda * min(c_bar, pi/mu)       trace-cutting coefficient
    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    v_t     = V(x_t) + delta_t + gamma c_t (v_{t+1} - V(x_{t+1}))       (the V-trace target)
    A_t     = rho_t (r_t + gamma v_{t+1} - V(x_t))                      (the policy-gradient advantage)

``next_values`` are V(next_observation_t), the true next observation, so the recursion needs no
separate bootstrap value. As in ``ppo_math.gae``: the trace is cut where an episode ended
(``dones``) and at the fragment's end, where v_{t+1} falls back to V(next_observation_t); a
terminated step does not bootstrap at all (``terminated``; by default every done is one, as in
RLightning), a truncated one bootstraps from its last frame. With pi = mu, lambda = 1 and
rho_bar, c_bar >= 1, v_t is the n-step bootstrapped return to the end of the episode or fragment.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def vtrace_correction(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    dones: torch.Tensor,
    log_rhos: torch.Tensor,
    gamma: float = 0.99,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    *,
    terminated: torch.Tensor | None = None,
    lambda_: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets ``vs`` and advantages ``pg_advantages``, both shaped like ``rewards``."""
    tensors = {"rewards": rewards, "values": values, "next_values": next_values, "dones": dones}
    tensors["log_rhos"] = log_rhos
    if terminated is not None:
        tensors["terminated"] = terminated
    if len({tuple(t.shape) for t in tensors.values()}) != 1 or rewards.dim() == 0:
        listed = ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items())
        raise ValueError(f"vtrace_correction needs equal [..., T] shapes, got {listed}")
    if rho_bar <= 0 or c_bar <= 0:
        raise ValueError(f"vtrace_correction needs rho_bar > 0 and c_bar > 0, got {rho_bar} and {c_bar}")
    rewards = rewards.float()
    values = values.float()
    next_values = next_values.float()
    ended = dones.bool()
    bootstraps = 1.0 - (ended if terminated is None else terminated.bool()).float()
    continues = 1.0 - ended.float()  # does step t+1 belong to the same trajectory?
    rhos = log_rhos.float().exp()
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = lambda_ * torch.clamp(rhos, max=c_bar)
    deltas = clipped_rhos * (rewards + gamma * bootstraps * next_values - values)

    vs = torch.zeros_like(values)
    next_vs = next_values.clone()  # v_{t+1}: V(next_observation_t) where the trace is cut
    correction = torch.zeros_like(values[..., 0])  # v_{t+1} - V(x_{t+1}); 0 past the fragment's end
    for t in reversed(range(rewards.shape[-1])):
        correction = deltas[..., t] + gamma * cs[..., t] * continues[..., t] * correction
        vs[..., t] = values[..., t] + correction
        if t + 1 < rewards.shape[-1]:
            next_vs[..., t] = torch.where(ended[..., t], next_values[..., t], vs[..., t + 1])
    pg_advantages = clipped_rhos * (rewards + gamma * bootstraps * next_vs - values)
    return vs, pg_advantages

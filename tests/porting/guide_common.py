"""The parts of a policy the Customize Policy guide leaves to the user, shared by the ported policies.

Plain user code: it imports nothing from rlkube. ``ppo_update`` is a small PPO epoch over the
``[envs, T]`` rows that ``update_dataset`` received (keys as docs/porting-from-rlightning.md lists
them); ``dist`` and ``value`` are the policy's own functions.
"""

import torch
from torch import nn


class NatureCNN(nn.Module):
    """The guide's encoder name; CartPole and Pendulum observations are vectors, so an MLP."""

    def __init__(self, obs_dim=3, hidden_dim=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden_dim), nn.Tanh())
        self.out_feature_dim = hidden_dim

    def forward(self, obs):
        return self.net(obs)


def ppo_update(data, *, dist, value, optimizer, gamma=0.99, lam=0.95, clip=0.2, epochs=2, minibatches=2):
    """GAE per row, then clipped-surrogate minibatch epochs; returns the last loss."""
    obs = data["observation"].float()
    rows, steps = obs.shape[:2]
    with torch.no_grad():
        values = value(obs)
        next_values = value(data["next_observation"].float())
        not_terminated = 1.0 - data["terminated"].float()
        continues = 1.0 - (data["terminated"] | data["truncated"]).float()
        advantages = torch.zeros_like(values)
        lastgaelam = torch.zeros_like(values[:, 0])
        for t in reversed(range(steps)):
            delta = data["reward"][:, t] + gamma * next_values[:, t] * not_terminated[:, t] - values[:, t]
            lastgaelam = delta + gamma * lam * continues[:, t] * lastgaelam
            advantages[:, t] = lastgaelam
        returns = advantages + values
    b_obs = obs.reshape(rows * steps, *obs.shape[2:])
    b_actions = data["action"].reshape(rows * steps, *data["action"].shape[2:])
    b_logprobs = data["log_prob"].reshape(-1)
    b_advantages = advantages.reshape(-1)
    b_returns = returns.reshape(-1)
    batch = b_obs.shape[0]
    mb_size = max(2, batch // minibatches)
    loss = torch.zeros(())
    for _ in range(epochs):
        order = torch.randperm(batch)
        for start in range(0, batch - mb_size + 1, mb_size):
            mb = order[start : start + mb_size]
            d = dist(b_obs[mb])
            new_logprob = d.log_prob(b_actions[mb])
            if new_logprob.ndim > 1:
                new_logprob = new_logprob.sum(-1)
            ratio = (new_logprob - b_logprobs[mb]).exp()
            mb_adv = (b_advantages[mb] - b_advantages[mb].mean()) / (b_advantages[mb].std() + 1e-8)
            pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_loss = 0.5 * ((value(b_obs[mb]) - b_returns[mb]) ** 2).mean()
            loss = pg_loss + 0.5 * v_loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss.detach())

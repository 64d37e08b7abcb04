"""The built-in PPO corrects rows tagged stale with V-trace and keeps GAE for fresh ones."""

from __future__ import annotations

import math
from typing import cast

import torch
from rlkube.data.fragment import POLICY_LAG
from rlkube.envs.group import EnvGroup
from rlkube.policy.builtin.actor_critic import ActorCritic
from rlkube.policy.builtin.ppo import PPO
from rlkube.policy.builtin.ppo_math import gae
from rlkube.policy.utils.vtrace import vtrace_correction
from rlkube.spec import PolicySpec, TrainSpec
from tensordict import TensorDict


def trainer(**train: object) -> PPO:
    with EnvGroup("CartPole-v1", num_envs=1, seed=0) as group:
        group.reset()
        spec = PolicySpec.model_validate({"type": "PPO", "weightBuffer": {"strategy": "None"}})
        policy = PPO(spec, "train")
        policy.init_train(TrainSpec.model_validate({"batchSize": 8, **train}), env_meta=group.meta)
    return policy


def fragment_rows(lags: list[int], steps: int = 6) -> TensorDict:
    generator = torch.Generator().manual_seed(1)
    rows = len(lags)
    return TensorDict(
        {
            "observation": torch.randn(rows, steps, 4, generator=generator),
            "next_observation": torch.randn(rows, steps, 4, generator=generator),
            "action": torch.randint(0, 2, (rows, steps), generator=generator),
            # a behaviour policy that was nearly sure of its actions: pi/mu < 1 everywhere
            "log_prob": torch.full((rows, steps), -0.05),
            "reward": torch.ones(rows, steps),
            "terminated": torch.rand(rows, steps, generator=generator) > 0.8,
            "truncated": torch.zeros(rows, steps, dtype=torch.bool),
            POLICY_LAG: torch.tensor(lags)[:, None].expand(rows, steps).clone(),
        },
        batch_size=[rows, steps],
    )


def learner_log_probs(policy: PPO, data: TensorDict) -> torch.Tensor:
    rows, steps = data.batch_size
    with torch.no_grad():
        obs = data["observation"].reshape(rows * steps, 4)
        _, log_prob, _, _ = cast(ActorCritic, policy.model)(obs, data["action"].reshape(-1))
    return log_prob.reshape(rows, steps)


def expected(policy: PPO, data: TensorDict, *, rho_bar: float, c_bar: float) -> tuple[torch.Tensor, ...]:
    model = cast(ActorCritic, policy.model)
    rows, steps = data.batch_size
    with torch.no_grad():
        values = model.value(data["observation"].reshape(rows * steps, 4)).reshape(rows, steps)
        next_values = model.value(data["next_observation"].reshape(rows * steps, 4)).reshape(rows, steps)
    terminated, truncated = data["terminated"], data["truncated"]
    algo = policy.algo
    adv, ret = gae(
        data["reward"],
        values,
        next_values,
        terminated,
        truncated,
        gamma=algo.gamma,
        gae_lambda=algo.gae_lambda,
    )
    vs, pg = vtrace_correction(
        data["reward"],
        values,
        next_values,
        terminated | truncated,
        learner_log_probs(policy, data) - data["log_prob"],
        algo.gamma,
        rho_bar,
        c_bar,
        terminated=terminated,
        lambda_=algo.gae_lambda,
    )
    return adv, ret, vs, pg


def test_stale_rows_get_vtrace_targets_and_fresh_rows_keep_gae() -> None:
    policy = trainer(vtraceRhoClip=0.9, vtraceCClip=0.7)
    data = fragment_rows([0, 2, 0, 1])
    adv, ret, vs, pg = expected(policy, data, rho_bar=0.9, c_bar=0.7)
    policy.update_dataset(data)
    got_adv = policy.dataset["advantages"].reshape(4, 6)
    got_ret = policy.dataset["returns"].reshape(4, 6)
    for row, stale in enumerate([False, True, False, True]):
        assert torch.allclose(got_adv[row], pg[row] if stale else adv[row], atol=1e-5)
        assert torch.allclose(got_ret[row], vs[row] if stale else ret[row], atol=1e-5)
    assert not torch.allclose(vs[1], ret[1])  # the correction changed something
    metrics = policy.pop_metrics()
    assert metrics["charts/vtrace_rows"] == 2.0
    assert 0.0 < metrics["charts/vtrace_mean_clipped_rho"] <= 0.9
    assert math.isfinite(policy.train()["losses/value_loss"])


def test_a_batch_without_lags_trains_exactly_as_before() -> None:
    policy = trainer()
    data = fragment_rows([1, 1])
    plain = data.exclude(POLICY_LAG)
    adv, ret, _, _ = expected(policy, plain, rho_bar=1.0, c_bar=1.0)
    policy.update_dataset(plain)
    assert torch.allclose(policy.dataset["advantages"].reshape(2, 6), adv, atol=1e-6)
    assert torch.allclose(policy.dataset["returns"].reshape(2, 6), ret, atol=1e-6)
    assert "charts/vtrace_rows" not in policy.pop_metrics()


def anchors(policy: PPO, data: TensorDict) -> torch.Tensor:
    """The log-probs the clipped ratio of each row is taken against, ``[rows, T]``."""
    policy.update_dataset(data)
    return policy.dataset["logprobs"].reshape(data.batch_size)


def test_a_stale_rows_ratio_starts_at_one_against_the_learner_and_fresh_rows_keep_the_behaviours() -> None:
    policy = trainer()  # vtraceClipAnchor: learner, the default
    data = fragment_rows([0, 2, 0, 1])
    got = anchors(policy, data)
    learner = learner_log_probs(policy, data)
    for row, stale in enumerate([False, True, False, True]):
        assert torch.allclose(got[row], learner[row] if stale else data["log_prob"][row], atol=1e-6)
    assert not torch.allclose(learner[1], data["log_prob"][1])  # the two anchors differ here
    # The advantages are V-trace's either way: rho_t is the importance weight, counted once.
    _, _, _, pg = expected(policy, data, rho_bar=1.0, c_bar=1.0)
    assert torch.allclose(policy.dataset["advantages"].reshape(4, 6)[1], pg[1], atol=1e-5)


def test_the_behaviour_anchor_takes_every_rows_ratio_against_the_policy_that_collected_it() -> None:
    policy = trainer(vtraceClipAnchor="behaviour")
    data = fragment_rows([0, 2, 0, 1])
    assert torch.equal(anchors(policy, data), data["log_prob"].float())

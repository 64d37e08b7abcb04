"""The built-in SAC validates its settings, acts within the action bounds and trains on replay samples."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rlkube.envs.group import EnvGroup
from rlkube.launch.preflight import preflight
from rlkube.policy import POLICIES
from rlkube.policy.builtin.sac import SAC
from rlkube.spec import PolicySpec, SpecError, TrainSpec, parse_job
from tensordict import TensorDict


def sac_spec(**sections: Any) -> PolicySpec:
    return PolicySpec.model_validate({"type": "SAC", "weightBuffer": {"strategy": "None"}, **sections})


def trainer(**sections: Any) -> tuple[SAC, EnvGroup]:
    group = EnvGroup("Pendulum-v1", num_envs=2, seed=0)
    group.reset()
    policy = SAC(sac_spec(modelCfg={"hiddenSizes": [32, 32]}, **sections), "train")
    policy.init_train(TrainSpec.model_validate({"batchSize": 8, "stepsPerEpoch": 16}), env_meta=group.meta)
    return policy, group


def test_sac_is_registered_under_its_name() -> None:
    assert POLICIES.get("SAC") is SAC


def test_bad_settings_name_their_field() -> None:
    with pytest.raises(SpecError) as caught:
        SAC(sac_spec(algoCfg={"tau": 2.0}), "train")
    assert any("spec.policy.algoCfg.tau: got 2.0" in line for line in caught.value.problems)


def test_a_discrete_action_space_is_refused_with_the_reason() -> None:
    with EnvGroup("CartPole-v1", num_envs=1, seed=0) as group:
        group.reset()
        with pytest.raises(ValueError, match="SAC needs a bounded Box action space"):
            SAC(sac_spec(), "train").init_train(TrainSpec(), env_meta=group.meta)


def test_a_job_that_gives_sac_a_rollout_buffer_is_refused_before_it_starts() -> None:
    job = parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "sac"},
            "spec": {"policy": {"type": "SAC"}, "env": {"id": "Pendulum-v1"}},
        }
    )
    refusal = preflight(job).refusal
    assert refusal is not None
    assert "spec.buffer.type: SAC learns from replay buffers only, got 'rollout'" in refusal.message


def test_actions_stay_within_the_box_and_greedy_is_repeatable() -> None:
    train, group = trainer()
    policy = SAC(sac_spec(modelCfg={"hiddenSizes": [32, 32]}), "eval")
    policy.init_eval(env_meta=group.meta)
    policy.load_state_dict(train.get_trainable_parameters())
    with group:
        first = group.reset()
        sampled = policy._rollout(first).action
        greedy = [policy._rollout(first, deterministic=True).action for _ in range(2)]
    assert sampled.shape == (2, 1)
    assert sampled.abs().max().item() <= 2.0  # Pendulum's torque bound
    assert torch.equal(greedy[0], greedy[1])


def test_each_epoch_samples_one_minibatch_per_gradient_step() -> None:
    policy, group = trainer(algoCfg={"updatesPerStep": 0.5})
    group.close()
    assert policy.replay_sample_size(16, 1) == 8 * 8  # 0.5 * 16 steps of 8 transitions


def transitions(count: int) -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    return TensorDict(
        {
            "observation": torch.randn(count, 3, generator=generator),
            "next_observation": torch.randn(count, 3, generator=generator),
            "action": torch.rand(count, 1, generator=generator) * 4 - 2,
            "reward": -torch.rand(count, generator=generator),
            "terminated": torch.zeros(count, dtype=torch.bool),
            "truncated": torch.zeros(count, dtype=torch.bool),
        },
        batch_size=[count],
    )


def test_train_steps_every_network_moves_the_targets_by_tau_and_logs_metrics() -> None:
    policy, group = trainer(algoCfg={"tau": 0.5})
    group.close()
    nets = policy.networks
    before = {name: p.detach().clone() for name, p in nets.named_parameters()}
    targets_before = [p.detach().clone() for p in nets.critic_target.parameters()]
    policy.update_dataset(transitions(policy.replay_sample_size(16, 1)))
    metrics = policy.train()
    moved = {name for name, p in nets.named_parameters() if not torch.equal(p, before[name])}
    assert {"log_alpha", "mu.weight", "log_std.weight", "trunk.0.weight", "critic.q1.0.weight"} <= moved
    pairs = list(zip(targets_before, nets.critic_target.parameters(), nets.critic.parameters(), strict=True))
    assert any(not torch.equal(old, new) for old, new, _ in pairs)  # Polyak steps moved the targets...
    assert any(not torch.equal(new, critic) for _, new, critic in pairs)  # ...part of the way only
    assert all(p.grad is None for p in nets.critic_target.parameters())  # never by gradient
    assert metrics["charts/gradient_steps"] == 16.0
    assert {"losses/qf_loss", "losses/actor_loss", "losses/alpha_loss", "charts/alpha"} <= set(metrics)

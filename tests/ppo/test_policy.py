"""The built-in PPO validates its settings, acts in discrete and continuous spaces and trains on fragments."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rlkube.envs.group import EnvGroup
from rlkube.policy import POLICIES
from rlkube.policy.builtin.ppo import PPO
from rlkube.spec import PolicySpec, SpecError, TrainSpec


def ppo_spec(**sections: Any) -> PolicySpec:
    return PolicySpec.model_validate({"type": "PPO", "weightBuffer": {"strategy": "None"}, **sections})


def pair(env_id: str, *, num_envs: int = 4, **sections: Any) -> tuple[PPO, PPO, EnvGroup]:
    group = EnvGroup(env_id, num_envs=num_envs, seed=0)
    group.reset()
    spec = ppo_spec(**sections)
    train = PPO(spec, "train")
    train.init_train(TrainSpec.model_validate({"batchSize": 16, "stepsPerEpoch": 64}), env_meta=group.meta)
    evaluator = PPO(spec, "eval")
    evaluator.init_eval(env_meta=group.meta)
    evaluator.load_state_dict(train.get_trainable_parameters())
    return train, evaluator, group


def test_ppo_is_registered_under_its_name() -> None:
    assert POLICIES.get("PPO") is PPO


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"algoCfg": {"gamma": 1.5}}, "spec.policy.algoCfg.gamma: got 1.5, expected less than or equal to 1"),
        ({"algoCfg": {"gaeLamda": 0.9}}, "spec.policy.algoCfg.gaeLamda: unknown key (known: clipCoef"),
        ({"algoCfg": {"updateEpochs": 0}}, "spec.policy.algoCfg.updateEpochs: got 0"),
        ({"optimCfg": {"lr": -1}}, "spec.policy.optimCfg.lr: got -1, expected greater than 0"),
        ({"optimCfg": {"annealLr": "sometimes"}}, "spec.policy.optimCfg.annealLr: got 'sometimes'"),
        ({"modelCfg": {"activation": "sigmoid"}}, "spec.policy.modelCfg.activation: got 'sigmoid'"),
        ({"modelCfg": {"hiddenSizes": [64, 0]}}, "spec.policy.modelCfg.hiddenSizes.1: got 0"),
    ],
)
def test_bad_settings_name_their_field(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        PPO(ppo_spec(**sections), "train")
    assert any(message in line for line in caught.value.problems), caught.value.problems


def test_snake_case_settings_are_accepted_too() -> None:
    policy = PPO(ppo_spec(algoCfg={"gae_lambda": 0.8, "updateEpochs": 3}), "train")
    assert policy.algo.gae_lambda == 0.8
    assert policy.algo.update_epochs == 3


def test_discrete_rollout_returns_action_log_prob_and_value_per_env() -> None:
    _, evaluator, group = pair("CartPole-v1")
    with group:
        response = evaluator._rollout(group.reset())
    assert response.action.shape == (4,)
    assert response.action.dtype == torch.int64
    assert response.log_prob.shape == (4,)
    assert response.value.shape == (4,)


def test_continuous_rollout_samples_a_gaussian_and_greedy_is_its_mean() -> None:
    _, evaluator, group = pair("Pendulum-v1", modelCfg={"initLogStd": -0.5})
    with group:
        first = group.reset()
        sampled = evaluator._rollout(first)
        greedy_a = evaluator._rollout(first, deterministic=True)
        greedy_b = evaluator._rollout(first, deterministic=True)
    assert sampled.action.shape == (4, 1)
    assert torch.equal(greedy_a.action, greedy_b.action)
    assert not torch.equal(sampled.action, greedy_a.action)
    assert [name for name, _ in evaluator.model_list] == ["model"]
    assert "model.log_std" in evaluator.get_param_fingerprint()


def fake_fragment_data(rows: int = 4, steps: int = 8) -> Any:
    from tensordict import TensorDict

    torch.manual_seed(0)
    return TensorDict(
        {
            "observation": torch.randn(rows, steps, 4),
            "next_observation": torch.randn(rows, steps, 4),
            "action": torch.randint(0, 2, (rows, steps)),
            "log_prob": torch.full((rows, steps), -0.69),
            "value": torch.zeros(rows, steps),
            "reward": torch.ones(rows, steps),
            "terminated": torch.rand(rows, steps) > 0.9,
            "truncated": torch.zeros(rows, steps, dtype=torch.bool),
        },
        batch_size=[rows, steps],
    )


def test_update_and_train_change_the_weights_and_log_cleanrl_metrics() -> None:
    train, _, group = pair("CartPole-v1", algoCfg={"updateEpochs": 2}, optimCfg={"lr": 0.01})
    group.close()
    before = train.get_param_fingerprint()
    train.update_dataset(fake_fragment_data())
    assert len(train.dataset) == 32
    metrics = train.train()
    assert train.get_param_fingerprint() != before
    expected = {
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "charts/learning_rate",
        "charts/update_epochs",
    }
    assert expected <= set(metrics)
    assert set(train.pop_metrics()) == set(metrics)
    assert metrics["charts/learning_rate"] == pytest.approx(0.01)
    assert metrics["charts/update_epochs"] == 2.0


def test_the_global_batch_is_split_over_ranks() -> None:
    train, _, group = pair("CartPole-v1")
    group.close()
    train.update_dataset(fake_fragment_data())
    assert train.minibatch_size() == 16
    train.world_size = 2
    assert train.minibatch_size() == 8


def test_annealing_lowers_the_rate_each_update_and_is_an_optimizer_state() -> None:
    train, _, group = pair(
        "CartPole-v1", optimCfg={"lr": 0.01, "annealLr": True}, algoCfg={"updateEpochs": 1}
    )
    group.close()
    train.update_dataset(fake_fragment_data())
    first = train.train()["charts/learning_rate"]
    second = train.train()["charts/learning_rate"]
    assert first == pytest.approx(0.01)
    assert second == pytest.approx(0.01 * (1 - 1 / 100))  # TrainSpec default maxEpochs is 100
    assert set(train.optimizers()) == {"optimizer", "lr_scheduler"}


def test_target_kl_stops_the_update_passes_early() -> None:
    train, _, group = pair(
        "CartPole-v1", algoCfg={"updateEpochs": 50, "targetKl": 1e-6}, optimCfg={"lr": 0.05}
    )
    group.close()
    train.update_dataset(fake_fragment_data())
    assert train.train()["charts/update_epochs"] < 50

"""``modelCfg.observationStats: perStep``: the acting policy moves the statistics at every step."""

from __future__ import annotations

import pytest
import torch
from rlkube.envs.types import EnvRet
from rlkube.policy.builtin.ppo import NORMALIZED_OBSERVATION, PPO
from rlkube.spec import PolicySpec, SpecError, TrainSpec
from tensordict import TensorDict

from tests.ppo.test_obs_norm import meta, stats

PER_STEP = {
    "modelCfg": {"normalizeObservation": True, "observationStats": "perStep"},
    "algoCfg": {"updateEpochs": 1},
    "weightBuffer": {"strategy": "None"},
}


def policy(role: str) -> PPO:
    made = PPO(PolicySpec.model_validate({"type": "PPO", **PER_STEP}), role)
    if role == "train":
        made.init_train(TrainSpec.model_validate({"batchSize": 16, "stepsPerEpoch": 32}), env_meta=meta())
    else:
        made.init_eval(env_meta=meta())
    return made


def collect(evaluator: PPO, steps: int = 8, rows: int = 4) -> TensorDict:
    """A fragment as the rollout loop builds it: observations far from mean 0, var 1."""
    torch.manual_seed(0)
    obs = 30.0 + 3.0 * torch.randn(rows, steps + 1, 4)
    fields: dict[str, list[torch.Tensor]] = {"action": [], "log_prob": [], NORMALIZED_OBSERVATION: []}
    for t in range(steps):
        response = evaluator.rollout_step(EnvRet(env_id=torch.arange(rows), observation=obs[:, t]))
        for key in fields:
            fields[key].append(getattr(response, key))
    ended = torch.zeros(rows, steps, dtype=torch.bool)
    ended[0, 3] = True  # a time limit: row 0's next observation at step 3 is its final frame
    return TensorDict(
        {
            "observation": obs[:, :steps],
            "next_observation": obs[:, 1:],
            "reward": torch.ones(rows, steps),
            "terminated": torch.zeros(rows, steps, dtype=torch.bool),
            "truncated": ended,
            **{key: torch.stack(values, dim=1) for key, values in fields.items()},
        },
        batch_size=[rows, steps],
    )


def moving(evaluator: PPO) -> dict[str, torch.Tensor]:
    """The acting worker's own per-step statistics."""
    assert evaluator._step_stats is not None
    norm = evaluator._step_stats[1]
    return {"count": norm.count.clone(), "mean": norm.mean.clone(), "var": norm.var.clone()}


def test_each_step_moves_the_statistics_before_the_policy_acts_on_it() -> None:
    evaluator = policy("eval")
    raw = 30.0 + 3.0 * torch.randn(4, 4)
    response = evaluator.rollout_step(EnvRet(env_id=torch.arange(4), observation=raw))
    after = moving(evaluator)
    assert after["count"].item() == pytest.approx(4 + 1e-4)
    assert torch.allclose(after["mean"], raw.double().mean(0), rtol=1e-4)
    # The observation it acted on was normalised with the statistics that include it.
    normalized = getattr(response, NORMALIZED_OBSERVATION)
    assert evaluator._step_stats is not None
    assert torch.allclose(normalized, evaluator._step_stats[1](raw))
    assert normalized.abs().max() < 3.0
    evaluator.rollout_step(EnvRet(env_id=torch.arange(4), observation=raw + 1.0))
    assert moving(evaluator)["count"].item() == pytest.approx(8 + 1e-4)
    # The model's buffers stay the loaded version's (they may be a shared snapshot; fingerprints).
    assert stats(evaluator)["count"].item() == pytest.approx(1e-4)


def test_a_new_version_restarts_the_moving_statistics_from_its_own() -> None:
    evaluator, trainer = policy("eval"), policy("train")
    trainer.update_dataset(collect(policy("eval")))
    trainer.train()
    evaluator.rollout_step(EnvRet(env_id=torch.arange(4), observation=torch.randn(4, 4)))
    evaluator.load_state_dict(trainer.get_trainable_parameters())
    evaluator.weight_version = 1
    raw = 30.0 + torch.randn(4, 4)
    evaluator.rollout_step(EnvRet(env_id=torch.arange(4), observation=raw))
    assert moving(evaluator)["count"].item() == pytest.approx(stats(trainer)["count"].item() + 4)


def test_greedy_evaluation_steps_leave_the_statistics_alone() -> None:
    evaluator = policy("eval")
    evaluator.rollout_step(EnvRet(env_id=torch.arange(2), observation=torch.randn(2, 4)), deterministic=True)
    assert evaluator._step_stats is None
    assert stats(evaluator)["count"].item() == pytest.approx(1e-4)


def test_the_trainer_trains_on_the_observations_as_collected_and_ends_with_the_workers_statistics() -> None:
    evaluator, trainer = policy("eval"), policy("train")
    data = collect(evaluator)
    trainer.update_dataset(data)
    # The trainer merged the same raw batch: it holds the statistics the worker ended with.
    worker, merged = moving(evaluator), stats(trainer)
    assert merged["count"].item() == pytest.approx(worker["count"].item())
    assert torch.allclose(merged["mean"], worker["mean"])
    assert torch.allclose(merged["var"], worker["var"])
    # It trains on what the worker normalised (not on the raw observations through new statistics).
    assert torch.equal(trainer.dataset["obs"], data[NORMALIZED_OBSERVATION].reshape(32, 4).float())
    metrics = trainer.train()
    assert metrics["losses/approx_kl"] < 1e-2  # the same inputs as at collection: ratio 1 at the start
    assert stats(trainer)["count"].item() == pytest.approx(merged["count"].item())  # not merged twice


def test_per_step_statistics_need_observation_normalisation() -> None:
    with pytest.raises(SpecError, match="observationStats"):
        PPO(PolicySpec.model_validate({"type": "PPO", "modelCfg": {"observationStats": "perStep"}}), "eval")

"""Train code names the learner's device for every tensor it makes: proven on a CPU-only machine.

On a GPU a tensor made without ``device=`` lands on the CPU and meets the model's CUDA outputs
(``cpu += cuda`` raises "Expected all tensors to be on the same device"). A CPU machine cannot see
that, so these tests run the train step, the eval step and a checkpoint round trip with torch's
default device set to ``meta``: any tensor made without naming a device then lands on ``meta``,
holds no data, and breaks the step at once, while tensors made on the learner's device (CPU here)
compute as usual. The built-in PPO's first version failed exactly here on an H200.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from rlkube.engine.checkpoint import CheckpointStore, TrainerProgress
from rlkube.envs.group import EnvGroup
from rlkube.policy.builtin.ppo import PPO
from rlkube.spec import PolicySpec, TrainSpec

from tests.ppo.test_nature_cnn import pixel_group
from tests.ppo.test_policy import fake_fragment_data

CASES = {
    "discrete": ("CartPole-v1", {}),
    "discrete-normalised": ("CartPole-v1", {"modelCfg": {"normalizeObservation": True}}),
    "continuous": ("Pendulum-v1", {"modelCfg": {"normalizeObservation": True}}),
}


def ppo(sections: dict[str, Any], group: EnvGroup) -> tuple[PPO, PPO]:
    spec = PolicySpec.model_validate(
        {"type": "PPO", "weightBuffer": {"strategy": "None"}, "algoCfg": {"updateEpochs": 2}, **sections}
    )
    train = PPO(spec, "train")
    train.init_train(TrainSpec.model_validate({"batchSize": 16, "stepsPerEpoch": 64}), env_meta=group.meta)
    evaluator = PPO(spec, "eval")
    evaluator.init_eval(env_meta=group.meta)
    evaluator.load_state_dict(train.get_trainable_parameters())
    return train, evaluator


def collected(group: EnvGroup, evaluator: PPO, steps: int = 8) -> Any:
    from rlkube.engine.rollout import RolloutWorker

    return RolloutWorker(group, evaluator).collect(steps).data


def assert_finite(metrics: dict[str, float]) -> None:
    for key, value in metrics.items():
        if key != "losses/explained_variance":  # NaN by definition when returns do not vary
            assert math.isfinite(value), (key, value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_ppo_update_makes_every_tensor_on_the_learners_device(case: str) -> None:
    env_id, sections = CASES[case]
    group = EnvGroup(env_id, num_envs=4, seed=0)
    with group:
        group.reset()
        train, evaluator = ppo(sections, group)
        data = collected(group, evaluator)
    before = train.get_param_fingerprint()
    with torch.device("meta"):
        train.update_dataset(data)
        metrics = train.train()
    assert_finite(metrics)
    assert train.get_param_fingerprint() != before
    assert train.dataset.device == torch.device("cpu")


def test_a_ppo_update_on_pixels_makes_every_tensor_on_the_learners_device() -> None:
    with pixel_group() as group:
        group.reset()
        train, evaluator = ppo({"modelCfg": {"encoder": "nature_cnn"}}, group)
        data = collected(group, evaluator)
    with torch.device("meta"):
        train.update_dataset(data)
        metrics = train.train()
    assert_finite(metrics)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_eval_step_makes_every_tensor_on_the_policys_device(case: str) -> None:
    env_id, sections = CASES[case]
    group = EnvGroup(env_id, num_envs=4, seed=0)
    with group:
        first = group.reset()
        _, evaluator = ppo(sections, group)
        with torch.device("meta"):
            response = evaluator._rollout(first)
    assert response.action.device == torch.device("cpu")
    assert torch.isfinite(response.log_prob).all()


def test_the_observation_statistics_update_on_their_own_device() -> None:
    from rlkube.policy.builtin.running_stats import RunningObsNorm

    norm = RunningObsNorm(3)
    batch = torch.randn(32, 3, dtype=torch.float64) * 2.0 + 1.0
    with torch.device("meta"):
        norm.update_(batch)
        out = norm(batch)
    assert norm.mean.device == torch.device("cpu")
    assert torch.allclose(norm.mean, batch.mean(0), atol=1e-3)
    assert torch.isfinite(out).all()


def test_a_checkpoint_saves_and_resumes_with_no_tensor_on_the_default_device(tmp_path: Path) -> None:
    group = EnvGroup("Pendulum-v1", num_envs=4, seed=0)
    with group:
        group.reset()
        train, _ = ppo({"modelCfg": {"normalizeObservation": True}}, group)
        resumed, _ = ppo({"modelCfg": {"normalizeObservation": True}}, group)
    train.update_dataset(fake_fragment_data_for(train))
    train.train()  # the optimizer now holds state to save
    store = CheckpointStore(tmp_path)
    with torch.device("meta"):
        store.save(train, TrainerProgress(epoch=1, env_steps=64))
        latest = store.latest()
        assert latest is not None
        store.load(latest, resumed)
    assert resumed.get_param_fingerprint() == train.get_param_fingerprint()
    moments = resumed.optimizer.state_dict()["state"] if resumed.optimizer is not None else {}
    assert moments
    assert all(t.device == torch.device("cpu") for s in moments.values() for t in s.values() if t.dim() > 0)


def fake_fragment_data_for(policy: PPO) -> Any:
    """Pendulum-shaped fragments (3 observation features, 1 action dim)."""
    data = fake_fragment_data()
    rows, steps = data.batch_size
    data["observation"] = torch.randn(rows, steps, 3)
    data["next_observation"] = torch.randn(rows, steps, 3)
    data["action"] = torch.randn(rows, steps, 1)
    return data


def test_the_ported_example_policy_trains_with_every_tensor_on_its_device() -> None:
    from rlkube.launch.preflight import resolve_policy
    from rlkube.spec import RLJob

    from tests.porting.test_custom_policy import job

    spec = job()
    assert isinstance(spec, RLJob)
    cls = resolve_policy(spec)
    group = EnvGroup("CartPole-v1", num_envs=4, seed=0)
    with group:
        group.reset()
        train = cls(spec.spec.policy, "train")
        train.init_train(spec.spec.train, env_meta=group.meta)
        evaluator = cls(spec.spec.policy, "eval")
        evaluator.init_eval(env_meta=group.meta)
        evaluator.load_state_dict(train.get_trainable_parameters())
        data = collected(group, evaluator, steps=16)
        evaluator.close()
    with torch.device("meta"):
        train.update_dataset(data)
        metrics = train.train()
    assert math.isfinite(metrics["loss"])
